"""The DeepSpeed learner: policy (and critic) updates on packed trajectories.

The policy — and the critic when the advantage estimator needs values — are wrapped by
``deepspeed.initialize`` with the ZeRO stage from the config; the frozen reference is a plain
module in eval mode. A mini-batch is split into micro-batches by a token budget, gradients are
accumulated over them (DeepSpeed's unmanaged accumulation: ``step()`` is the boundary), and each
micro-batch's loss is weighted by its share of the mini-batch so the result does not depend on
how the batch was split.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_r1.algorithms import (
    aggregate,
    entropy_from_logits,
    get_policy_loss,
    kl_penalty,
    logprobs_from_logits,
    value_loss,
    with_demonstrated_tokens,
)
from agent_r1.atomic import replace_dir
from agent_r1.dicts import deep_merge
from agent_r1.learner.distributed import (all_gather_object, all_reduce, barrier, broadcast_object, init_distributed,
                                          is_main, rank, world_size)
from agent_r1.learner.lora import add_lora, merged
from agent_r1.models import autocast, cache_kwarg, output_cache
from agent_r1.trajectory import TrainBatch


class LearnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-4, gt=0)
    """Learning rate of the policy (SFT uses sft.lr instead)."""
    critic_lr: float = Field(3e-4, gt=0)
    """Learning rate of the critic (estimators with a value model: gae)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    zero_stage: int = Field(0, ge=0, le=3)
    """DeepSpeed ZeRO stage (0-3)."""
    micro_batch_tokens: int = Field(8192, gt=0)
    """Token budget of one forward/backward micro-batch (gradients are accumulated over them)."""
    grad_clip: float = Field(1.0, gt=0)
    """Gradient-norm clipping threshold."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each iteration's batch."""
    mini_batches: int = Field(1, ge=1)
    """Optimizer steps per pass (the batch is split into this many)."""
    policy_loss: str = "ppo"
    """Policy loss: a name registered in agent_r1.algorithms (ppo, vanilla, gspo: GSPO's sequence-level ratio) or the import path of a function
    registered with @register_policy_loss (`module:fn`, `path/to/file.py:fn`). The settings it takes that the config
    does not set (clip_low, clip_high, dual_clip, loss_agg) take its function's defaults: gspo brings its paper's clip
    range 3e-4 / 4e-4 and seq-mean-token-mean, ppo and vanilla the defaults below."""

    @field_validator("policy_loss")
    @classmethod
    def _policy_loss(cls, v: str) -> str:
        from agent_r1.algorithms import registered_name

        return registered_name(v, "policy loss")
    clip_low: float = Field(0.2, ge=0)
    """PPO ratio clip below 1 (ratio ≥ 1 - clip_low); unset, the policy loss's default (gspo: 3e-4)."""
    clip_high: float = Field(0.2, ge=0)
    """PPO ratio clip above 1 (ratio ≤ 1 + clip_high); above clip_low it is DAPO's clip-higher (Yu et al. 2025,
    arXiv:2503.14476: 0.28 with clip_low 0.2); unset, the policy loss's default (gspo: 4e-4)."""
    dual_clip: float | None = 3.0
    """Dual-clip bound on the loss of negative-advantage tokens (> 1; null disables)."""
    loss_agg: str = "token-mean"
    """How the RL update's token losses are averaged: token-mean, seq-mean-token-mean or seq-mean-token-sum; unset, the
    policy loss's default (gspo: seq-mean-token-mean). SFT and the control always take the token mean."""
    kl_coef: float = Field(0.0, ge=0)  # KL to the frozen reference, added to the loss
    """Weight of the KL penalty to the frozen reference model (0: no reference is loaded)."""
    kl_kind: str = "k3"
    """KL estimator: k1, k2 or k3."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of the entropy bonus."""
    value_clip: float = Field(0.2, ge=0)
    """Clip range of the critic's value update."""
    off_policy_correction: Literal["tis", "decoupled", "none"] = "tis"
    """How an update corrects for episodes sampled by an older policy (rl.max_staleness ≥ 1) or by a rollout engine
    whose numbers are not the learner's (a bf16 rollout beside an fp32 update); not applied otherwise. The
    token weight is w = π_prox / π_behav (π_prox: the policy before this update, which the PPO ratio is taken against;
    π_behav: the log-probs the rollout sampled with): `tis`, truncated importance sampling, min(w, is_cap) (Yao et al.
    2025, "Your efficient RL framework secretly brings you off-policy RL training"; verl's rollout IS, SkyRL); `decoupled`,
    AReaL's decoupled PPO objective (Fu et al. 2025, arXiv:2505.24298): w, with weight 0 for the tokens whose w > is_cap
    (they stay in the loss's denominator);
    `none`: no weight (stale episodes are trained on as if sampled by π_prox)."""
    is_cap: float = Field(2.0, gt=1)
    """The cap on the importance weight w of off_policy_correction."""
    shaping_gamma: float = Field(0.1, gt=0)
    """γ of LUFFY's policy shaping f(π) = π/(π+γ), the weight of the demonstrated tokens of an off-policy member of a
    group (rl.demos: member), unclipped; the sampled tokens keep policy_loss."""
    temperature: float = Field(1.0, gt=0)  # logits are divided by the rollout temperature
    """Logits are divided by it when computing log-probs for the update; in a pipeline it must equal rl.temperature
    (the config rejects a mismatch)."""
    share_prefix: bool = True
    """Run the tokens every row of a micro-batch starts with (the system prompt; also the question when the micro-batch is one GRPO group) once, not once per row, when computing log-probs (exact: the same values and gradients)."""
    lora_rank: int = Field(0, ge=0)
    """>0: RL trains rank-r LoRA adapters on the decoder's linear layers instead of every weight (checkpoints are saved merged); SFT and the control always train every weight."""
    lora_alpha: float = Field(32.0, gt=0)
    """LoRA scale numerator: the adapters' output is multiplied by lora_alpha / lora_rank."""
    deepspeed_config: str | None = None
    """A DeepSpeed JSON file (e.g. infra/deepspeed/zero3.json; relative to the working directory) merged over the learner's own DeepSpeed keys: bf16, ZeRO stage (it wins over zero_stage), offload, bucket sizes. With optimizer offload the learner uses DeepSpeed's CPU Adam. null: the learner's keys alone."""

    @field_validator("deepspeed_config")
    @classmethod
    def _deepspeed_config(cls, v: str | None) -> str | None:
        if v is not None:
            read_deepspeed_json(v)
        return v

    @model_validator(mode="after")
    def _policy_loss_defaults(self) -> "LearnerConfig":
        """The settings the policy loss takes that the config leaves unset get the loss's own defaults
        (``PolicyLoss.defaults``), so a dump of the config (the run's MLflow params) shows what is in force.
        They are written past pydantic's ``model_fields_set``, which keeps naming what the user set."""
        from agent_r1.algorithms import POLICY_LOSSES

        if self.policy_loss in POLICY_LOSSES:  # an unknown name is reported by the config's checks
            for key, value in POLICY_LOSSES[self.policy_loss].defaults().items():
                if key not in self.model_fields_set:
                    self.__dict__[key] = value
        return self


# Micro-batching is the learner's: it splits a mini-batch by micro_batch_tokens and calls step() itself.
LEARNER_OWNED = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "managed_gradient_accumulation": False}


def read_deepspeed_json(path: str) -> dict:
    """The DeepSpeed config file ``path``; a ValueError in one line if it is missing, not a JSON
    object, or sets the learner's micro-batching keys (:data:`LEARNER_OWNED`) otherwise."""
    f = Path(path)
    if not f.is_file():
        raise ValueError(f"{path}: no such DeepSpeed config file")
    try:
        cfg = json.loads(f.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a DeepSpeed config is a JSON object")
    for key, value in LEARNER_OWNED.items():
        if key in cfg and cfg[key] != value:
            raise ValueError(f"{path}: {key}={cfg[key]!r}, but the learner micro-batches itself ({key} must be {value!r})")
    return cfg


def ds_config(cfg: LearnerConfig) -> dict:
    """What the learner initialises DeepSpeed with: its own keys (:func:`_ds_config`) with the file
    ``cfg.deepspeed_config`` merged over them."""
    own = _ds_config(cfg)
    return deep_merge(own, read_deepspeed_json(cfg.deepspeed_config)) if cfg.deepspeed_config else own


def _ds_config(cfg: LearnerConfig) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _initialize(module: torch.nn.Module, lr: float, cfg: LearnerConfig):
    """``module`` as a DeepSpeed engine with the learner's AdamW, or DeepSpeed's CPU Adam (the same
    update, a vectorised C++ op) when the config offloads the optimizer to the CPU."""
    import deepspeed

    init_distributed()
    params = [p for p in module.parameters() if p.requires_grad]
    config = ds_config(cfg)
    offload = (config.get("zero_optimization", {}).get("offload_optimizer") or {}).get("device", "none")
    if offload in ("cpu", "nvme"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # compiled on first use (~30 s on a CPU)

        opt = DeepSpeedCPUAdam(params, lr=lr, weight_decay=cfg.weight_decay, adamw_mode=True)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=config)
    return engine


MIN_SHARED_TOKENS = 8  # a shorter common prefix is not worth the second forward call


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor, at: torch.Tensor) -> int:
    """How many leading columns every row holds with the same ids (none padded), cut before the
    first hidden state ``at`` needs (``at[:, t]``: position t's output is used), and so that at
    least one column is left. 0 for a single row."""
    if input_ids.shape[0] < 2:
        return 0
    same = ((input_ids == input_ids[:1]) & attention_mask.bool()).all(0)
    n = int(same.long().cumprod(0).sum())
    needed = at.any(0).nonzero()
    return min(n, int(needed[0]) if len(needed) else n, input_ids.shape[1] - 1)


def _hidden_after(decoder, input_ids, attention_mask, shared: int) -> torch.Tensor:
    """The decoder's last hidden states of the columns from ``shared`` on. The first ``shared``
    columns, the same in every row, run once (one row) and their keys and values serve every row:
    exactly the full forward's values and, through the expanded cache, its gradients."""
    if shared == 0:
        return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    B, T = input_ids.shape
    cache = output_cache(decoder(input_ids=input_ids[:1, :shared], attention_mask=attention_mask[:1, :shared],
                                 use_cache=True))
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1)
    pos = torch.arange(shared, T, device=input_ids.device).expand(B, -1)
    return decoder(input_ids=input_ids[:, shared:], attention_mask=attention_mask, position_ids=pos,
                   **{cache_kwarg(decoder): cache}, use_cache=True).last_hidden_state


def token_logprobs(model, input_ids, attention_mask, temperature: float = 1.0, with_entropy: bool = False,
                   positions: torch.Tensor | None = None, share_prefix: bool = False):
    """log p(ids[t] | ids[:t]) aligned to ``input_ids`` (position 0 gets 0), optionally entropies.

    With ``positions`` (a bool mask like ``input_ids``, e.g. the loss mask) the LM head and the
    softmax over the vocabulary run only at those positions and the rest are 0: for a 49k-token
    vocabulary that head is a fifth of a small model's forward, and the context tokens (prompt,
    observations), most of a sequence, never need it. With ``share_prefix`` too, the columns
    every row starts with (the system prompt; the question too if all rows are one group's) run once
    (:func:`shared_prefix_len`, when at least ``MIN_SHARED_TOKENS``).
    """
    if positions is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        targets = input_ids[:, 1:]
    else:
        at = positions[:, 1:].bool()
        shared = shared_prefix_len(input_ids, attention_mask, at) if share_prefix else 0
        shared = shared if shared >= MIN_SHARED_TOKENS else 0
        hidden = _hidden_after(model.get_decoder(), input_ids, attention_mask, shared)
        logits = model.get_output_embeddings()(hidden[:, :-1][at[:, shared:]])
        targets = input_ids[:, 1:][at]
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    outs = [logprobs_from_logits(logits, targets)] + ([entropy_from_logits(logits)] if with_entropy else [])
    if positions is not None:  # scatter back to [B, T-1]
        full = [torch.zeros(at.shape, dtype=o.dtype, device=o.device).masked_scatter(at, o) for o in outs]
        outs = full
    pad = torch.zeros_like(input_ids[:, :1], dtype=logits.dtype)
    outs = [torch.cat([pad, o], dim=1) for o in outs]
    return (outs[0], outs[1]) if with_entropy else outs[0]


def split_by_tokens(rows: torch.Tensor, lengths: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Split row indices into micro-batches whose padded size (rows × longest) fits ``budget``."""
    order = rows[torch.argsort(lengths[rows], descending=True)]
    out, cur, longest = [], [], 0
    for r in order.tolist():
        n = int(lengths[r])
        if cur and max(longest, n) * (len(cur) + 1) > budget:
            out.append(torch.tensor(cur))
            cur, longest = [], 0
        cur.append(r)
        longest = max(longest, n)
    if cur:
        out.append(torch.tensor(cur))
    return out


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _evened(micros: list[torch.Tensor], needed: bool) -> int:
    """Pad ``micros`` in place, on every rank, to the most micro-batches any rank has (``needed``:
    ZeRO-2/3 reduce gradients in each backward and ZeRO-3 gathers the weights in each forward, so the
    ranks' passes must pair up), and to at least one (a rank without rows still takes part in the step).
    The padding repeats row 0 and weighs 0; returns the number of real micro-batches."""
    real = len(micros)
    if world_size() > 1:
        n = int(all_reduce([real], "max")[0]) if needed else max(real, 1)
        micros += [torch.tensor([0])] * (n - real)
    return real


def _partitions(engine, weights_only: bool = False) -> bool:
    """Does this DeepSpeed engine shard gradients (ZeRO-2/3), or the weights too (ZeRO-3)?"""
    attr = "zero_optimization_partition_weights" if weights_only else "zero_optimization_partition_gradients"
    return bool(getattr(engine, attr, lambda: False)())


def off_policy_weights(prox: torch.Tensor, mb: TrainBatch, cfg: LearnerConfig) -> tuple[torch.Tensor, dict]:
    """The advantages the policy loss takes for a mini-batch ``mb``: unchanged, unless its episodes
    were sampled ahead of the learner or by an engine that is not exact (``mb.behaviour_logprobs``:
    rl.max_staleness ≥ 1, a bf16 rollout beside an fp32 update) and
    ``cfg.off_policy_correction`` weighs them by w = π_prox / π_behav (``prox``: the log-probs before
    this update). The weight scales the advantages, which weighs the clipped surrogate token by token
    (w ≥ 0 factors out of its max and of the dual-clip cap). ``decoupled`` gives the tokens over the cap
    weight 0 and keeps them in the loss mask, so they still count in the loss's denominator and the
    update does not depend on how the batch is cut into micro-batches (as AReaL does). Metrics: the
    mean weight and the share of tokens truncated (``tis``) or left out (``decoupled``)."""
    mode, mask = cfg.off_policy_correction, mb.loss_mask
    if mb.behaviour_logprobs is None or mode == "none":
        return mb.advantages, {}
    w = torch.exp((prox - mb.behaviour_logprobs).clamp(-20.0, 20.0)).detach()
    w = torch.where(mb.action_mask.bool(), w, 1.0)  # tokens it did not sample (rl.loss_mask off) keep weight 1
    over = (w > cfg.is_cap) & mask.bool()
    w = w.clamp(max=cfg.is_cap) if mode == "tis" else torch.where(over, 0.0, w)
    share = float(over.sum()) / max(float(mask.sum()), 1.0)
    return mb.advantages * w, {"is_weight_mean": aggregate(w, mask, "token-mean").item(),
                               f"is_{'truncated' if mode == 'tis' else 'masked'}_share": share}


class ValueModel(torch.nn.Module):
    """A critic: the policy's transformer body with a scalar head, one value per token."""

    def __init__(self, causal_lm: torch.nn.Module):
        super().__init__()
        self.body = causal_lm.get_decoder()
        self.head = torch.nn.Linear(causal_lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask):
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden).squeeze(-1)


@dataclass
class _Weights:
    tokens: float
    seqs: float


class Learner:
    """Owns the DeepSpeed engines and applies SFT and RL updates."""

    def __init__(self, policy, cfg: LearnerConfig, reference=None, critic: ValueModel | None = None,
                 precision: str = "auto"):
        self.cfg = cfg
        self.precision = precision  # forward passes under agent_r1.models.autocast; fp32 master weights
        if cfg.lora_rank:
            if ds_config(cfg)["zero_optimization"].get("stage", 0) == 3:
                raise ValueError("rl.learner.lora_rank needs zero_stage 0-2 (ZeRO-3 partitions the frozen weights)")
            add_lora(policy, cfg.lora_rank, cfg.lora_alpha)
        self.engine = _initialize(policy, cfg.lr, cfg)
        self.reference = reference.eval().requires_grad_(False).to(_device(policy)) if reference is not None else None
        self.critic = _initialize(critic, cfg.critic_lr, cfg) if critic is not None else None
        self.policy_loss = get_policy_loss(cfg.policy_loss)

    @property
    def model(self):
        return self.engine.module

    # ---------------------------------------------------------------- forward-only passes
    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, model=None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probs of ``batch`` at its loss-mask positions (of its ``rows``; everything else
        stays 0) under the policy (or ``model``), micro-batched, no grad."""
        model = model if model is not None else self.model
        was = model.training
        model.eval()
        out = torch.zeros_like(batch.attention_mask, dtype=torch.float)
        lengths = batch.attention_mask.sum(1)
        rows = torch.arange(len(lengths)) if rows is None else rows
        micros = split_by_tokens(rows, lengths, self.cfg.micro_batch_tokens)
        real = _evened(micros, model is self.model and _partitions(self.engine, weights_only=True))
        for i, micro in enumerate(micros):
            mb = batch.select(micro, _device(model))
            T = mb.input_ids.shape[1]
            with autocast(self.precision, _device(model)):
                lp = token_logprobs(model, mb.input_ids, mb.attention_mask, self.cfg.temperature,
                                   positions=mb.loss_mask, share_prefix=self.cfg.share_prefix).float().cpu()
            if i < real:
                out[micro, :T] = lp
        model.train(was)
        return out

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        out = torch.zeros_like(batch.attention_mask, dtype=torch.float)
        lengths = batch.attention_mask.sum(1)
        micros = split_by_tokens(torch.arange(len(lengths)), lengths, self.cfg.micro_batch_tokens)
        real = _evened(micros, _partitions(self.critic, weights_only=True))
        for i, rows in enumerate(micros):
            mb = batch.select(rows, _device(self.critic))
            with autocast(self.precision, _device(self.critic)):
                v = self.critic(mb.input_ids, mb.attention_mask).float().cpu()
            if i < real:
                out[rows, : mb.input_ids.shape[1]] = v
        return out

    # ---------------------------------------------------------------- updates
    def _minibatches(self, n: int, generator: torch.Generator | None):
        """This rank's rows (of ``n``) of each mini-batch. The permutation is of every rank's rows
        (rank r's after those of ranks < r), the same on every rank and the same as one process's
        over the union of their rows; each rank keeps its own rows of each part (maybe none)."""
        counts = all_gather_object(n)
        offset, total = sum(counts[: rank()]), sum(counts)
        perm = torch.randperm(total, generator=generator)
        return [m[(m >= offset) & (m < offset + n)] - offset for m in perm.chunk(self.cfg.mini_batches) if len(m)]

    def _weight(self, mb_mask: torch.Tensor, total: _Weights) -> float:
        if self.cfg.loss_agg == "token-mean":
            return float(mb_mask.sum()) / max(total.tokens, 1.0)
        return float((mb_mask.sum(1) > 0).sum()) / max(total.seqs, 1.0)

    def _accumulate(self, engine, batch: TrainBatch, rows: torch.Tensor, mask_key: str, loss_fn,
                    compute: torch.Tensor | None = None) -> dict:
        """Backward over token-budgeted micro-batches of ``rows``, then one optimizer step.

        ``compute``, a subset of ``rows``, is the rows whose loss can have a gradient: only
        they are run, while the loss stays normalised over all of ``rows``, so the step is the
        one over all of them. Metrics are averages over the rows run.

        With N ranks, ``rows`` is this rank's part of the mini-batch: the loss is normalised over
        every rank's rows (their token and sequence counts summed) and multiplied by N, which
        DeepSpeed's gradient all-reduce divides by, so the step is the one a single process takes
        over the union of the ranks' rows; the metrics are averaged over every rank's rows.
        """
        world = world_size()
        mask = getattr(batch, mask_key)[rows]
        total = _Weights(*all_reduce([float(mask.sum()), float((mask.sum(1) > 0).sum())]))
        lengths = batch.attention_mask.sum(1)
        micros = split_by_tokens(rows if compute is None else compute, lengths, self.cfg.micro_batch_tokens)
        real = _evened(micros, _partitions(engine))
        sums: dict[str, float] = {}
        w_sum = 0.0
        for i, micro in enumerate(micros):
            mb = batch.select(micro, _device(engine))
            w = self._weight(getattr(mb, mask_key), total) if i < real else 0.0
            if w == 0 and world == 1:
                continue
            with autocast(self.precision, _device(engine)):
                loss, metrics = loss_fn(mb)
            engine.backward(loss * (w * world))
            w_sum += w
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + w * float(v)
        engine.step()
        keys = sorted(sums)
        w_sum, *values = all_reduce([w_sum] + [sums[k] for k in keys])
        return {k: v / w_sum for k, v in zip(keys, values)}

    @property
    def single_step(self) -> bool:
        """One optimizer step per update (one epoch, one mini-batch): the policy that computes
        the loss is the one that sampled, so the old log-probs are the loss's own (detached) and
        need no forward pass of their own (the ratio is exactly 1 and the gradient that of A·log p)."""
        return self.cfg.ppo_epochs == 1 and self.cfg.mini_batches == 1

    def policy_rows(self, batch: TrainBatch) -> torch.Tensor:
        """Rows of ``batch`` whose policy loss can have a gradient.

        With no KL and no entropy term, a row whose advantages are zero on every loss token
        (for instance a GRPO group whose samples all got the same reward) adds exactly zero to
        the PPO gradient; :meth:`update` and the old log-probs (``build_train_batch``) skip it.
        """
        n = len(batch)
        if (self.reference is not None and self.cfg.kl_coef > 0) or self.cfg.entropy_coef > 0:
            return torch.arange(n)
        live = ((batch.advantages != 0) & batch.loss_mask.bool()).any(1)
        return live.nonzero().squeeze(1)

    def sft_step(self, batch: TrainBatch, rows: torch.Tensor | None = None) -> dict:
        """One optimizer step of next-token cross-entropy on the loss-masked (action) tokens,
        normalised over every rank's loss tokens. ``rows``: this rank's rows (default: its share
        of a batch every rank holds)."""

        def loss_fn(mb):
            logp = token_logprobs(self.model, mb.input_ids, mb.attention_mask, positions=mb.loss_mask,
                                  share_prefix=self.cfg.share_prefix)
            loss = -aggregate(logp, mb.loss_mask, self.cfg.loss_agg)
            return loss, {"sft_loss": loss.detach()}

        self.engine.train()  # with N ranks, each runs its share of the batch's rows
        rows = torch.arange(len(batch)).tensor_split(world_size())[rank()] if rows is None else rows
        return self._accumulate(self.engine, batch, rows, "loss_mask", loss_fn)

    def _policy_loss(self, logp: torch.Tensor, prox: torch.Tensor, advantages: torch.Tensor, mb: TrainBatch):
        """``policy_loss`` over the loss mask; with the demonstrated tokens of an off-policy member
        (``mb.demo_mask``), LUFFY's shaped weight on those (:func:`with_demonstrated_tokens`)."""
        kw = self.policy_loss.kwargs(self.cfg)
        if mb.demo_mask is None:
            return self.policy_loss(logp, prox, advantages, mb.loss_mask, **kw)
        return with_demonstrated_tokens(self.policy_loss, logp, prox, advantages, mb.loss_mask, mb.demo_mask,
                                        self.cfg.shaping_gamma, **kw)

    def update(self, batch: TrainBatch, generator: torch.Generator | None = None) -> dict:
        """PPO-style policy (and critic) epochs over ``batch``.

        ``batch`` is a :class:`~agent_r1.trajectory.TrainBatch` with ``advantages``, ``old_logprobs``
        (None when :attr:`single_step`) and, when a reference/critic is used, ``ref_logprobs`` /
        ``returns`` / ``old_values``.
        """
        cfg = self.cfg

        def policy_loss_fn(mb):
            logp, ent = token_logprobs(self.model, mb.input_ids, mb.attention_mask, cfg.temperature, with_entropy=True,
                                       positions=mb.loss_mask, share_prefix=cfg.share_prefix)
            mask = mb.loss_mask
            prox = logp.detach() if mb.old_logprobs is None else mb.old_logprobs
            advantages, is_metrics = off_policy_weights(prox, mb, cfg)
            loss, metrics = self._policy_loss(logp, prox, advantages, mb)
            entropy = aggregate(ent, mask, cfg.loss_agg)
            metrics = {f"policy/{k}": v for k, v in (metrics | is_metrics).items()}
            metrics["policy/pg_loss"] = loss.detach()
            metrics["policy/entropy"] = entropy.detach()
            if self.reference is not None and cfg.kl_coef > 0:
                kl = aggregate(kl_penalty(logp, mb.ref_logprobs, cfg.kl_kind), mask, cfg.loss_agg)
                loss = loss + cfg.kl_coef * kl
                metrics["policy/kl"] = kl.detach()
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * entropy
            if first_step:  # before any step: the learner's old log-probs
                act = mb.action_mask * mask.bool()
                gap = ((logp.detach().float() - mb.sample_logprobs).abs() * act).sum() / act.sum().clamp(min=1)
                metrics["rollout/logprob_gap"] = gap
            return loss, metrics

        def critic_loss_fn(mb):
            v = self.critic(mb.input_ids, mb.attention_mask)
            loss, metrics = value_loss(v, mb.old_values, mb.returns, mb.adv_mask, clip=cfg.value_clip, agg=cfg.loss_agg)
            return loss, {"critic/" + k: val for k, val in metrics.items()} | {"critic/loss": loss.detach()}

        self.engine.train()
        live = torch.zeros(len(batch), dtype=torch.bool)
        live[self.policy_rows(batch)] = True
        history: dict[str, list[float]] = {}
        first_step = True  # rollout/logprob_gap: |sampling - learner| log-probs, from the first step's forward
        for _ in range(cfg.ppo_epochs):
            for rows in self._minibatches(len(batch), generator):
                # a mini-batch with no live row still steps (Adam moves on a zero gradient)
                compute = rows[live[rows]] if live[rows].any() else None
                for k, v in self._accumulate(self.engine, batch, rows, "loss_mask", policy_loss_fn, compute).items():
                    history.setdefault(k, []).append(v)
                first_step = False
                if self.critic is not None:
                    for k, v in self._accumulate(self.critic, batch, rows, "adv_mask", critic_loss_fn).items():
                        history.setdefault(k, []).append(v)
        stats = {k: sum(v) / len(v) for k, v in history.items()}
        n_live, n_rows, tokens = all_reduce([float(live.sum()), float(len(live)), float(batch.attention_mask[live].sum())])
        stats["update/live_share"] = n_live / n_rows  # share of rows the policy update ran (every rank's)
        stats["update/tokens"] = int(tokens) * cfg.ppo_epochs
        return stats

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: str | Path, tokenizer=None) -> Path:
        return save_hf_checkpoint(self.engine, path, tokenizer)

    def save_state(self, path: str | Path, client_state: dict, tokenizer=None) -> Path:
        """Everything a resume needs (weights, optimizer moments, ``client_state``), atomically.

        DeepSpeed's own checkpoint (any ZeRO stage) goes to a temp folder renamed over ``path``,
        so a process killed mid-write leaves the previous state intact; the temp folders such a
        kill left are removed here. With N ranks, every rank writes its shards (ZeRO's optimizer
        partitions) into rank 0's temp folder, and rank 0 alone renames it.
        """
        path = Path(path)
        tmp = None
        if is_main():
            path.parent.mkdir(parents=True, exist_ok=True)
            for stale in path.parent.glob(f".{path.name}.*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)
            for tag in ("policy", "critic") if self.critic is not None else ("policy",):
                Path(tmp, tag).mkdir()  # before DeepSpeed's every-rank makedirs, which then finds it
        tmp = Path(broadcast_object(tmp))
        self.engine.save_checkpoint(str(tmp), tag="policy", client_state=client_state, save_latest=False)
        if self.critic is not None:
            self.critic.save_checkpoint(str(tmp), tag="critic", save_latest=False)
        barrier()  # every rank's part is written
        if is_main():
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            replace_dir(tmp, path)
        return path

    def load_state(self, path: str | Path) -> dict:
        """Restore what :meth:`save_state` wrote; returns its ``client_state``. Every file is
        read with ``torch.load(weights_only=True)`` (see :mod:`agent_r1.checkpoints`)."""
        from agent_r1.checkpoints import load_deepspeed_state

        client = load_deepspeed_state(self.engine, path, "policy")
        if self.critic is not None:
            load_deepspeed_state(self.critic, path, "critic")
        return client


def save_hf_checkpoint(engine_or_model, path: str | Path, tokenizer=None) -> Path:
    """Write a Hugging Face folder (safetensors) atomically: into a temp dir, then rename.

    A reader (or a resumed run) never sees a half-written checkpoint: either the old folder or
    the complete new one is at ``path``. With N ranks every rank calls it (ZeRO-3's shards are
    gathered from all of them) and rank 0 alone writes one plain folder.
    """
    path = Path(path)
    module = getattr(engine_or_model, "module", engine_or_model)
    state = None
    if _partitions(engine_or_model, weights_only=True):
        state = engine_or_model._zero3_consolidated_16bit_state_dict()  # ZeRO-3: gathered on rank 0
    if is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        with merged(module):  # LoRA adapters (if any) folded into plain weights
            module.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        replace_dir(tmp, path)
    barrier()
    return path
