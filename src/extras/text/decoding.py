"""Text generation from any net that maps ``(B, T)`` ids to ``(B, T, V)`` logits, in plain torch:
:func:`filter_top_k`, :func:`filter_top_p`, :func:`next_token`, :func:`stream` and :func:`generate`.
They apply, in this order, the temperature, top-k, then top-p, as most generation libraries do;
:func:`check_decoding` is the one check of their settings (the CLI's, ``TextSamples``', the tasks').
"""

import math
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

from src.errors import UserInputError

Strategy = Literal["greedy", "sample"]

#: the seeds a torch generator takes: 64 bits
SEEDS = range(2**64)


def check_decoding(
    strategy: str,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    max_new_tokens: int = 0,
    *,
    vocabulary: int | None = None,
    seed: int = 0,
    token_limit: int | None = None,
) -> None:
    """One sentence for a decoding setting that means nothing (:class:`UserInputError`, a ValueError):
    the one check that :func:`next_token`, :func:`generate`, the CLI and ``TextSamples`` share.

    Args:
        strategy: ``greedy`` or ``sample``.
        temperature: At least 0 and finite (0 is greedy; any positive one, however small, is sampled
            without overflow: :func:`next_token`).
        top_k: At least 1 and at most ``vocabulary`` (when given), or None.
        top_p: In (0, 1], or None.
        max_new_tokens: At least 0, and at most ``token_limit`` when given.
        vocabulary: The ids the logits score, when known.
        seed: A seed torch takes: 0 to 2**64 - 1.
        token_limit: The most ``max_new_tokens`` a command accepts.
    """
    if strategy not in ("greedy", "sample"):
        raise UserInputError(f"strategy={strategy!r} is unknown; choose greedy or sample.")
    if not (temperature >= 0 and math.isfinite(temperature)):  # NaN fails both comparisons
        raise UserInputError(
            f"temperature={temperature} must be at least 0 and finite (0 picks the likeliest character)."
        )
    if top_k is not None and top_k < 1:
        raise UserInputError(f"top_k={top_k} must be at least 1 (or left out: no top-k filter).")
    if top_k is not None and vocabulary is not None and top_k > vocabulary:
        raise UserInputError(
            f"top_k={top_k} is more than the {vocabulary} ids of the vocabulary; give at most {vocabulary} "
            "(or leave it out: no top-k filter)."
        )
    if top_p is not None and not 0 < top_p <= 1:
        raise UserInputError(f"top_p={top_p} must lie in (0, 1] (or left out: no top-p filter).")
    if max_new_tokens < 0:
        raise UserInputError(f"max_new_tokens={max_new_tokens} must be at least 0.")
    if token_limit is not None and max_new_tokens > token_limit:
        raise UserInputError(
            f"max_new_tokens={max_new_tokens} is more than the {token_limit} allowed; ask for fewer, or "
            "raise the limit (token_limit)."
        )
    if seed not in SEEDS:
        raise UserInputError(f"seed={seed} must lie between 0 and 2**64 - 1 ({SEEDS.stop - 1}).")


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(..., V) logits with all but the ``k`` largest of each row set to ``-inf``.

    Exactly ``k`` stay, ties included: among equal logits at the ``k``-th place the lower ids stay (the
    order of a stable sort).
    """
    if k >= logits.shape[-1]:
        return logits
    order = logits.argsort(dim=-1, descending=True, stable=True)  # (..., V) ids, likeliest first
    return logits.scatter(-1, order[..., k:], float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """(..., V) logits with all but the nucleus set to ``-inf``: the smallest set of likeliest ids whose
    probabilities add up to at least ``p`` (one id alone when its own probability reaches ``p``; ties in
    order of a stable sort, lower ids first)."""
    ordered, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = ordered.softmax(dim=-1)
    # the probability of the ids more likely than each: an id is needed while they fall short of p
    before = torch.cat([torch.zeros_like(probs[..., :1]), probs.cumsum(dim=-1)[..., :-1]], dim=-1)
    drop_sorted = before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back in id order
    return logits.masked_fill(drop, float("-inf"))


def next_token(
    logits: torch.Tensor,
    strategy: Strategy = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(..., V) logits → (...) chosen ids; the settings checked by :func:`check_decoding`.

    ``greedy`` takes the likeliest id (the first of equal ones); ``sample`` draws from
    ``softmax(logits / temperature)`` after :func:`filter_top_k` and :func:`filter_top_p`, with
    ``generator``'s random numbers. A temperature of 0 is greedy. The logits are divided in float64 after
    their maximum is taken off, so that a temperature of 1e-300 still gives finite values (the likeliest
    id 0, the others at most 0): float32 would overflow to inf, or turn 1e-40 into 0 and divide by it.
    """
    check_decoding(strategy, temperature, top_k, top_p, vocabulary=logits.shape[-1])
    if strategy == "greedy" or temperature == 0:
        return logits.argmax(dim=-1)
    shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)  # (..., V), at most 0
    scaled = shifted / temperature
    if top_k is not None:
        scaled = filter_top_k(scaled, top_k)
    if top_p is not None and top_p < 1:
        scaled = filter_top_p(scaled, top_p)
    probs = scaled.softmax(dim=-1).reshape(-1, logits.shape[-1])  # (N, V)
    return torch.multinomial(probs, 1, generator=generator).reshape(logits.shape[:-1])


@torch.inference_mode()
def stream(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    strategy: Strategy = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    block_size: int | None = None,
) -> Iterator[torch.Tensor]:
    """The ids :func:`generate` adds, one step at a time as they are chosen: ``max_new_tokens`` tensors of
    ``(B,)`` ids, or ``()`` for a ``(T0,)`` prompt. Its arguments are :func:`generate`'s."""
    check_decoding(strategy, temperature, top_k, top_p, max_new_tokens, seed=seed)
    if prompt_ids.shape[-1] == 0:
        raise UserInputError("generate needs a prompt of at least one character.")
    device = next(model.parameters()).device
    ids = prompt_ids.to(device).reshape(-1, prompt_ids.shape[-1])  # (B, T0)
    generator = torch.Generator(device=device).manual_seed(seed)
    # greedy: the task's own rule for its likeliest next id, its predict_step's, when it has one
    rule = getattr(model, "predictions", None)
    greedy = (strategy == "greedy" or temperature == 0) and callable(rule)
    was_training = model.training
    model.eval()  # no dropout
    try:
        for _ in range(max_new_tokens):
            context = ids if block_size is None else ids[:, -block_size:]  # (B, <= block_size)
            logits = model(context)[:, -1]  # (B, V): the next character's
            if greedy:
                chosen = rule(logits)["preds"]  # type: ignore[misc]  # (B,)
            else:
                chosen = next_token(logits, strategy, temperature, top_k, top_p, generator)  # (B,)
            ids = torch.cat([ids, chosen.unsqueeze(-1)], dim=-1)
            yield chosen.reshape(prompt_ids.shape[:-1])
    finally:
        model.train(was_training)


def generate(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    strategy: Strategy = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    block_size: int | None = None,
) -> torch.Tensor:
    """The prompt followed by ``max_new_tokens`` ids, one at a time, each from the model's logits for
    the last position (:func:`next_token`; :func:`stream` hands them over as they come).

    Args:
        model: Maps ``(B, T)`` ids to ``(B, T, V)`` logits; run in eval mode, then put back as it was.
        prompt_ids: ``(T0,)`` or ``(B, T0)`` int64 ids, ``T0 >= 1``.
        max_new_tokens: Ids to add.
        strategy: ``greedy`` or ``sample``.
        temperature: Divides the logits before sampling; 0 is greedy.
        top_k: Sample among the ``top_k`` likeliest ids only.
        top_p: Sample among the nucleus of probability ``top_p`` only.
        seed: Seeds the sampling's own generator, so a seed gives the same text every time.
        block_size: Crop the context to its last ``block_size`` ids (the length the model was trained
            on, at most what it can read); ``None`` keeps it whole.

    Returns:
        ``(T0 + max_new_tokens,)`` or ``(B, T0 + max_new_tokens)`` ids, as the prompt was shaped.
    """
    steps = stream(model, prompt_ids, max_new_tokens, strategy, temperature, top_k, top_p, seed, block_size)
    added = [step.unsqueeze(-1) for step in steps]  # each (..., 1), on the model's device
    return torch.cat([prompt_ids.to(next(model.parameters()).device), *added], dim=-1)
