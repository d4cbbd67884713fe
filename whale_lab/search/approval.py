"""The approval gate between validation and scoring: manual, auto, or a smoke-success threshold.

`manual` asks the Reviewer (the TUI, the terminal prompt, a test), which may approve, reject with a
reason, edit then approve, pin, or leave the candidate pending (the phase then stops and the
candidate is still pending after a restart). `auto` approves every valid candidate; `threshold`
approves one whose smoke success rate reaches `approval.threshold`.
"""

from __future__ import annotations

from whale_lab.config import ApprovalConfig
from whale_lab.seams import ReviewDecision, Reviewer, ReviewItem

MODES = ("manual", "auto", "threshold")


class ApprovalGate:
    def __init__(self, mode: str, threshold: float = 0.0, reviewer: Reviewer | None = None) -> None:
        if mode not in MODES:
            raise ValueError(
                f"approval.mode: unknown mode {mode!r}; expected one of {', '.join(MODES)}"
            )
        if mode == "manual" and reviewer is None:
            raise ValueError('approval.mode = "manual" needs a reviewer (the TUI or a terminal)')
        self.mode = mode
        self.threshold = float(threshold)
        self.reviewer = reviewer

    @classmethod
    def from_config(
        cls, cfg: ApprovalConfig, reviewer: Reviewer | None, *, headless: bool = False
    ) -> ApprovalGate:
        """`approval.mode`, or `approval.headless_mode` when no human can answer."""
        mode = cfg.headless_mode if headless and cfg.mode == "manual" else cfg.mode
        return cls(mode, cfg.threshold, reviewer)

    def decide(self, item: ReviewItem) -> ReviewDecision:
        if self.mode == "auto":
            return ReviewDecision(
                "approve", reason="auto-approved (approval.mode = auto)", by="auto"
            )
        if self.mode == "threshold":
            smoke = item.smoke_success
            if smoke is not None and smoke >= self.threshold:
                return ReviewDecision(
                    "approve",
                    reason=f"smoke success {smoke:.0%} >= threshold {self.threshold:.0%}",
                    by="threshold",
                )
            shown = "none" if smoke is None else f"{smoke:.0%}"
            return ReviewDecision(
                "reject",
                reason=f"smoke success {shown} below threshold {self.threshold:.0%}",
                by="threshold",
            )
        assert self.reviewer is not None
        decision = self.reviewer.review(item)
        if decision.decision == "reject" and not decision.reason.strip():
            return ReviewDecision("reject", reason="rejected without a reason", by=decision.by)
        if decision.decision == "edit" and not (decision.edited_code or "").strip():
            return ReviewDecision(
                "approve", reason=decision.reason or "edit left the code as is", by=decision.by
            )
        return decision
