"""bfloat16 training with float32 master weights: the model computes in bf16, the optimizer updates fp32 copies.

Why: on this project's CPUs a bf16 model runs every phase of a GRPO step ~1.7x faster than fp32 (rollouts,
held-out evaluation, the loss's forward and backward; BENCHMARKS.md "Precision"), while torch's CPU autocast
(fp32 weights cast to bf16 at every matmul, what `grpo.bf16` / accelerate's mixed precision does) was ~25x
*slower* than fp32 for a forward+backward here. A model kept in bf16 alone cannot learn at GRPO's learning rates:
an AdamW step moves a weight by about the learning rate (2e-5), below half the bf16 spacing of a typical weight
(~1e-4 at 0.03), so most updates round away. The usual remedy (mixed precision with master weights, as in
Megatron and DeepSpeed): the optimizer keeps an fp32 copy of every trainable weight, applies AdamW to it with
the bf16 gradient widened to fp32, and writes the rounded result back into the model.

So sampling, the loss's log-probabilities and the reference model all compute in the model's one dtype, bf16,
and nothing of the update is lost. The fp32 copies are part of the optimizer's state (`state_dict`), so a
checkpoint resumes exactly. What stays bf16: the gradients accumulated over a step's micro-batches (their sum is
rounded once per micro-batch) and the weights the model computes with.

`grpo.master_weights: true` turns it on (`coevolve.train` swaps TRL's AdamW for `MasterWeightAdamW` over the same
parameter groups); it is meant for a model loaded in bf16 (`model.dtype: bfloat16`) and does nothing useful for
an fp32 one.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

MASTERS = "coevolve_master_weights"
"""The state-dict key holding the fp32 copies (in optimizer.pt of every checkpoint)."""


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over fp32 copies of the model's parameters; see the module docstring.

    `param_groups`: the model's parameters in groups, as `torch.optim.AdamW` takes them (each group's own
    options, e.g. weight decay, are kept). The optimizer's own groups hold the fp32 copies; `step` reads each
    model parameter's gradient and writes the updated copy back into it."""

    def __init__(self, param_groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter], **options: Any) -> None:
        groups = list(param_groups)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.model_params: list[torch.nn.Parameter] = []
        master_groups = []
        for group in groups:
            params = [p for p in group["params"] if p.requires_grad]
            masters = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
            self.model_params += params
            master_groups.append({**group, "params": masters})
        super().__init__(master_groups, **options)

    @property
    def masters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for model_param, master in zip(self.model_params, self.masters):
            master.grad = None if model_param.grad is None else model_param.grad.float()
        super().step()
        for model_param, master in zip(self.model_params, self.masters):
            model_param.copy_(master)  # rounds to the model's dtype
            master.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.model_params:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state[MASTERS] = [master.detach().clone() for master in self.masters]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop(MASTERS, None)
        super().load_state_dict(state_dict)
        with torch.no_grad():
            if masters is None:  # a checkpoint written without master weights: start them from the model
                masters = [p.detach().float() for p in self.model_params]
            if len(masters) != len(self.model_params):
                raise ValueError(f"the checkpoint holds {len(masters)} master weights, the model "
                                 f"{len(self.model_params)} trainable parameters")
            for master, saved, model_param in zip(self.masters, masters, self.model_params):
                master.copy_(saved)
                model_param.copy_(master)


def with_master_weights(optimizer: torch.optim.Optimizer) -> MasterWeightAdamW:
    """The same parameter groups and AdamW options as `optimizer` (an AdamW not yet stepped), on fp32 copies."""
    if not isinstance(optimizer, torch.optim.AdamW):
        raise TypeError(f"grpo.master_weights needs AdamW (the trainer built {type(optimizer).__name__})")
    options = {key: value for key, value in optimizer.defaults.items() if key in
               ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                "differentiable", "fused")}
    options["foreach"] = options.get("foreach") or None
    return MasterWeightAdamW(optimizer.param_groups, **options)
