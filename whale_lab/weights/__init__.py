"""The weight phase: online rejection-sampling fine-tuning (RSFT), on-policy and resumable.

`sampler` (the persistent prompt sampler), `sft` (accepted traces -> masked examples -> one
token-mean NLL pass), `lora` (LoRA via peft, or full fine-tuning), `checkpoint` (resume points,
evaluation checkpoints, served adapters), `rsft` (`RsftPhase`, the phase loop) and `train_cli`
(`whale-lab train`). Nothing here imports torch at package import time.
"""
