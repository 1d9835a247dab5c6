"""The character language model: decoding, the text DataModule, the nets, the loop's proofs on text,
and the CLI from a checkpoint alone."""

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray
from torch.utils.data import DataLoader, DistributedSampler
from typing_extensions import override

import src.extras.tables.test_data as data_tests
from src.cli import CLI, main
from src.data.loading import ResumableLoader, keep_batch
from src.errors import UserInputError
from src.extras.text import UNKNOWN_ID, UNKNOWN_TEXT, TextDataModule, Vocabulary, bundled_text
from src.extras.text.callback import TextSamples
from src.extras.text.conftest import T, last_checkpoint, tiny
from src.extras.text.model import (
    LanguageModel,
    filter_top_k,
    filter_top_p,
    generate,
    next_token,
    stream,
)
from src.extras.text.nets import CharGRU, CharTransformer
from tests.conftest import BARE, CONFIGS, QUIET

# these tests also need the extras below; without one of them they are skipped
NonFiniteGuard = pytest.importorskip("src.extras.guard").NonFiniteGuard

TRAINER = CONFIGS / "trainer"


# -- decoding ----------------------------------------------------------------------------------------------


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().flatten().tolist())


def test_greedy_is_the_argmax_and_the_first_of_equal_logits() -> None:
    logits = torch.randn(50, 30, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(next_token(logits, "greedy"), logits.argmax(dim=-1), rtol=0, atol=0)
    assert next_token(torch.tensor([0.0, 2.0, 2.0, 1.0]), "greedy").item() == 1


class Unlikeliest(LanguageModel):
    """A task whose rule picks the least likely character."""

    @override
    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"probs": logits.softmax(dim=-1), "preds": logits.argmin(dim=-1)}


def test_greedy_generation_and_predict_follow_the_tasks_own_predictions() -> None:
    """One rule for the likeliest next character, predict_step's and greedy generation's: a task that
    changes it (here to the least likely) changes both."""
    torch.manual_seed(0)
    model = Unlikeliest(in_features=12, out_features=12, net=CharGRU).eval()
    ids = generate(model, torch.tensor([1, 2, 3]), 4)
    with torch.no_grad():
        for t in range(3, 7):
            assert ids[t] == model(ids[:t].unsqueeze(0))[0, -1].argmin()
        window = ids[:5].unsqueeze(0)
        assert torch.equal(model.predict_step((window,), 0)["preds"], model(window)[:, -1].argmin(dim=-1))
    # the same weights under the shipped rule: the likeliest, the first step already another character
    plain = LanguageModel(in_features=12, out_features=12, net=CharGRU)
    plain.load_state_dict(model.state_dict())
    likeliest = generate(plain.eval(), ids[:3], 4)
    with torch.no_grad():
        assert likeliest[3] == plain(ids[:3].unsqueeze(0))[0, -1].argmax() != ids[3]


def test_top_k_keeps_exactly_k_and_breaks_ties_towards_lower_ids() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0, 3.0, 0.0])
    assert kept(filter_top_k(logits, 1)) == {1}
    assert kept(filter_top_k(logits, 2)) == {1, 3}  # three logits tie at 3.0: ids 1 and 3 stay, 4 goes
    assert kept(filter_top_k(logits, 4)) == {1, 2, 3, 4}
    assert torch.equal(filter_top_k(logits, 6), logits)  # k >= V: nothing to filter
    rows = torch.randn(20, 50, generator=torch.Generator().manual_seed(1))
    assert (torch.isfinite(filter_top_k(rows, 7)).sum(dim=-1) == 7).all()
    # the kept logits are unchanged, not renormalized here
    torch.testing.assert_close(filter_top_k(logits, 2)[[1, 3]], logits[[1, 3]], rtol=0, atol=0)


def test_top_p_keeps_the_smallest_set_of_likeliest_tokens_that_reaches_p() -> None:
    # probabilities 0.10, 0.50, 0.15, 0.25 (ids in no particular order)
    logits = torch.tensor([0.10, 0.50, 0.15, 0.25]).log()
    assert kept(filter_top_p(logits, 0.3)) == {1}  # the likeliest token alone reaches p
    assert kept(filter_top_p(logits, 0.5 - 1e-4)) == {1}  # the edge: alone, just
    assert kept(filter_top_p(logits, 0.6)) == {1, 3}
    assert kept(filter_top_p(logits, 0.8)) == {1, 3, 2}
    assert kept(filter_top_p(logits, 0.95)) == {0, 1, 2, 3}
    assert kept(filter_top_p(logits, 1.0)) == {0, 1, 2, 3}
    # reaching p exactly is enough (equal logits give probabilities that float32 holds exactly)
    assert kept(filter_top_p(torch.zeros(2), 0.5)) == {0}
    assert kept(filter_top_p(torch.zeros(4), 0.5)) == {0, 1}


def test_top_p_agrees_with_its_definition_on_random_rows() -> None:
    """The definition, written as a loop in float64: add the likeliest tokens until they reach p."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(200, 12, generator=generator, dtype=torch.float64) * 2
    ps = torch.rand(200, generator=generator, dtype=torch.float64)
    for row, p in zip(logits, ps.tolist(), strict=True):
        probs = row.softmax(dim=-1)
        expected, total = set(), 0.0
        for token in probs.argsort(descending=True, stable=True).tolist():
            expected.add(token)
            total += probs[token].item()
            if total >= p:
                break
        assert kept(filter_top_p(row, p)) == expected


def test_a_temperature_near_zero_is_greedy_and_zero_is_greedy_exactly() -> None:
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(3))
    greedy = logits.argmax(dim=-1)
    assert torch.equal(next_token(logits, "sample", temperature=0.0), greedy)
    for seed in range(5):
        drawn = next_token(logits, "sample", temperature=1e-4, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(drawn, greedy)
    # at temperature 1 the same generator draws other tokens: the test above could fail
    warm = next_token(logits, "sample", temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(warm, greedy)


def test_a_seed_repeats_its_draws_and_another_seed_differs() -> None:
    logits = torch.zeros(100, 40)  # uniform: every draw is up to the generator

    def draw(seed: int) -> torch.Tensor:
        return next_token(
            logits, "sample", top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(seed)
        )

    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    assert (draw(0) < 20).all()  # top-k of equal logits: the lower ids


def test_generate_crops_the_context_to_block_size_and_keeps_the_prompt() -> None:
    torch.manual_seed(0)
    net = CharTransformer(20, 20, block_size=8, d_model=16, n_heads=2, n_layers=1, dropout=0.1)
    prompt = torch.randint(0, 20, (12,))
    with pytest.raises(ValueError, match="12 characters, more than its block_size=8"):
        generate(net, prompt, 3)  # uncropped, the net cannot read it
    ids = generate(net, prompt, 5, "sample", seed=0, block_size=8)
    assert ids.shape == (17,)
    assert torch.equal(ids[:12], prompt)
    assert torch.equal(ids, generate(net, prompt, 5, "sample", seed=0, block_size=8))
    assert net.training  # put back as it was
    # greedy step by step by hand: the argmax of the last position given the last 8 ids
    with torch.no_grad():
        net.eval()
        by_hand = prompt.clone()
        for _ in range(5):
            by_hand = torch.cat([by_hand, net(by_hand[-8:][None])[0, -1].argmax()[None]])
    assert torch.equal(generate(net, prompt, 5, "greedy", block_size=8), by_hand)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": -0.5}, "temperature=-0.5 must be at least 0"),
        ({"top_k": 0}, "top_k=0 must be at least 1"),
        ({"top_p": 0.0}, r"top_p=0.0 must lie in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p=1.5 must lie in \(0, 1\]"),
        ({"strategy": "beam"}, "strategy='beam' is unknown"),
    ],
)
def test_meaningless_decoding_settings_are_one_sentence(settings: dict[str, Any], message: str) -> None:
    net = CharGRU(10, 10, 4, 8, 1)
    with pytest.raises(UserInputError, match=message):
        generate(net, torch.tensor([1, 2]), 3, **settings)
    with pytest.raises(UserInputError, match=message):
        TextSamples(**settings)


BAD_SETTINGS = [
    ({"temperature": -0.5}, "temperature=-0.5 must be at least 0 and finite"),
    ({"temperature": math.nan}, "temperature=nan must be at least 0 and finite"),
    ({"temperature": math.inf}, "temperature=inf must be at least 0 and finite"),
    ({"top_k": 0}, "top_k=0 must be at least 1"),
    ({"top_k": 11}, "top_k=11 is more than the 10 ids of the vocabulary; give at most 10"),
    ({"top_p": -0.1}, r"top_p=-0.1 must lie in \(0, 1\]"),
    ({"strategy": "beam"}, "strategy='beam' is unknown"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS)
def test_next_token_checks_its_settings_as_generate_does(settings: dict[str, Any], message: str) -> None:
    """One check (check_decoding) for the public next_token, generate and the CLI: a negative temperature
    would invert the distribution, a top_k past the vocabulary filter nothing."""
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(0))
    with pytest.raises(UserInputError, match=message):
        next_token(logits, **{"strategy": "sample", **settings})
    with pytest.raises(UserInputError, match=message):
        generate(CharGRU(10, 10, 4, 8, 1), torch.tensor([1, 2]), 3, **{"strategy": "sample", **settings})
    # top_k equal to the vocabulary: kept, and the same as no filter
    same = [
        next_token(logits, "sample", top_k=k, generator=torch.Generator().manual_seed(0)) for k in (10, None)
    ]
    assert torch.equal(*same)


@pytest.mark.parametrize("temperature", [1e-39, 1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_samples_the_likeliest_id_without_overflow(temperature: float) -> None:
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(3)) * 5
    drawn = next_token(logits, "sample", temperature=temperature, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(drawn, logits.argmax(dim=-1), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("seed", "fine"), [(0, True), (2**64 - 1, True), (2**64, False), (2**70, False), (-1, False)]
)
def test_a_seed_torch_cannot_take_is_a_sentence(seed: int, fine: bool) -> None:
    net = CharGRU(10, 10, 4, 8, 1)
    if fine:
        assert generate(net, torch.tensor([1, 2]), 3, "sample", seed=seed).shape == (5,)
        return
    with pytest.raises(UserInputError, match=rf"^seed={seed} must lie between 0 and 2\*\*64 - 1 \("):
        generate(net, torch.tensor([1, 2]), 3, "sample", seed=seed)


def test_stream_hands_over_each_id_before_computing_the_next() -> None:
    net = CharGRU(10, 10, 4, 8, 1)
    calls: list[int] = []
    net.register_forward_hook(lambda *_: calls.append(len(calls)))
    steps = stream(net, torch.tensor([1, 2]), 5, "sample", seed=1)
    seen = []
    for step in steps:
        seen.append((int(step), len(calls)))
    assert [count for _, count in seen] == [1, 2, 3, 4, 5]  # the k-th id out after the k-th forward pass
    assert [i for i, _ in seen] == generate(net, torch.tensor([1, 2]), 5, "sample", seed=1)[2:].tolist()


# -- the DataModule ----------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str | bytes, name: str = "text.txt") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_the_splits_are_contiguous_disjoint_stretches_in_order(small_text: Path) -> None:
    dm = TextDataModule(str(small_text), block_size=T, val_fraction=0.1, test_fraction=0.1)
    assert dm.stretches == {"train": (0, 9600), "val": (9600, 10800), "test": (10800, 12000)}
    assert dm.stretch("train") + dm.stretch("val") + dm.stretch("test") == dm.text
    for stage in ("train", "val", "test"):
        x, y = dm.dataset(stage).tensors
        assert x.dtype == y.dtype == torch.int64
        assert x.shape[1:] == y.shape[1:] == (T,)
        assert torch.equal(x[:, 1:], y[:, :-1])  # the targets are the inputs one character on
        # adjacent windows, each inside its own stretch: the first reads the stretch's start
        covered = dm.stretch(stage)[: len(x) * T + 1]  # every window, and the last one's last target
        assert torch.equal(torch.cat([*x, y[-1, -1:]]), dm.encode(covered))
    # the training stretch holds no character outside the vocabulary fitted on it
    assert UNKNOWN_ID not in dm.encode(dm.stretch("train"))
    assert len(dm.dataset("train")) == (9600 - 1) // T
    assert dm.in_features == dm.out_features == len(dm.vocabulary)
    assert dm.label_names == [UNKNOWN_TEXT, *dm.vocabulary.characters]


def test_a_stride_overlaps_the_training_windows_only(small_text: Path) -> None:
    dm = TextDataModule(str(small_text), block_size=T, stride=T // 4)
    x, _ = dm.dataset("train").tensors
    assert len(x) == (9600 - T - 1) // (T // 4) + 1
    assert torch.equal(x[1, : T - T // 4], x[0, T // 4 :])
    assert len(dm.dataset("val")) == (1200 - 1) // T  # validation windows never overlap


def test_the_vocabulary_comes_from_the_training_stretch_alone(tmp_path: Path) -> None:
    # 80 characters of train, then 10 of val and 10 of test with characters train never has
    path = write(tmp_path, "abcab" * 16 + "abxyz" * 2 + "zzzéé" * 2)
    dm = TextDataModule(str(path), block_size=4)
    assert dm.vocabulary.characters == ("a", "b", "c")
    ids = dm.encode("axé")
    assert ids.tolist() == [1, UNKNOWN_ID, UNKNOWN_ID]
    assert dm.decode(ids) == f"a{UNKNOWN_TEXT}{UNKNOWN_TEXT}"
    assert (dm.dataset("test").tensors[0] == UNKNOWN_ID).all()
    rare = TextDataModule(str(path), block_size=4, min_count=17)  # "c" occurs 16 times
    assert rare.vocabulary.characters == ("a", "b")
    assert rare.in_features == 3


def test_encode_and_decode_round_trip() -> None:
    text = bundled_text()[:5000]
    vocabulary = Vocabulary.fit(text)
    ids = vocabulary.encode(text)
    assert ids.dtype == torch.int64
    assert ids.shape == (5000,)
    assert vocabulary.decode(ids) == text
    assert vocabulary.decode(ids.tolist()) == text
    assert Vocabulary(()).encode("ab").tolist() == [UNKNOWN_ID, UNKNOWN_ID]  # no known characters at all
    emoji = Vocabulary.fit("a😀b")  # beyond the Basic Multilingual Plane: one id per character
    assert emoji.decode(emoji.encode("b😀a")) == "b😀a"


def test_the_state_round_trips_through_a_weights_only_checkpoint(small_text: Path, tmp_path: Path) -> None:
    dm = TextDataModule(str(small_text), block_size=T)
    iter(dm.train_dataloader()).__next__()  # the shuffle generator moved on
    path = tmp_path / "run.ckpt"
    torch.save({"state_dict": {}, "TextDataModule": dm.state_dict()}, path)
    state = torch.load(path, weights_only=True)["TextDataModule"]
    other = write(tmp_path, "qrstuvwxyz" * 100)  # another text: another vocabulary if fitted
    restored = TextDataModule(str(other), block_size=T)
    restored.load_state_dict(state)
    assert restored.vocabulary == dm.vocabulary
    assert torch.equal(restored._shuffle.get_state(), dm._shuffle.get_state())
    # preprocessing_from: the checkpoint's vocabulary, not one fitted on the data
    reused = TextDataModule(str(other), block_size=T, preprocessing_from=str(path))
    assert reused.vocabulary == dm.vocabulary
    assert reused.in_features == len(dm.vocabulary)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"data.path='.*missing.txt' does not exist; name a UTF-8 text file\."),
        (b"", r"data.path='.*text.txt' is empty \(0 bytes\)"),
        (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            r"data.path='.*text.txt' is a binary file \(it holds NUL bytes\)",
        ),
        ("café".encode("latin-1"), r"data.path='.*text.txt' is not UTF-8 text \(byte 0xe9 at offset 3"),
        (b"a short text", r"holds 12 characters, too few for data.block_size=16 .* the train stretch has 10"),
    ],
    ids=["missing", "empty", "binary", "latin-1", "too short"],
)
def test_bad_text_files_are_one_sentence(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "missing.txt" if content is None else write(tmp_path, content)
    with pytest.raises(UserInputError, match=message) as raised:
        TextDataModule(str(path), block_size=T).in_features  # noqa: B018  # reading it reads the text
    assert "\n" not in str(raised.value)


def test_a_folder_and_bad_settings_are_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="is a folder"):
        TextDataModule(str(tmp_path)).in_features  # noqa: B018
    with pytest.raises(UserInputError, match=r"data\.block_size=0 must be at least 1"):
        TextDataModule(block_size=0)
    with pytest.raises(UserInputError, match="together they must stay below 1"):
        TextDataModule(val_fraction=0.5, test_fraction=0.5)


def test_predict_reads_windows_and_names_where_each_starts(small_text: Path, tmp_path: Path) -> None:
    dm = TextDataModule(str(small_text), block_size=T)
    (x,) = dm.dataset("predict").tensors
    index = dm.predict_index()
    assert index.name == "offset"
    assert len(index) == len(x) == (1200 - 1) // T  # each window and the character after it
    assert dm.decode(x[2]) == dm.text[index[2] : index[2] + T]
    given = TextDataModule(
        str(small_text), block_size=T, predict_path=str(write(tmp_path, "x" * 40, "new.txt"))
    )
    assert given.predict_index().tolist() == [0, 16]


def test_the_unigram_baseline_is_the_perplexity_of_train_frequencies(small_text: Path) -> None:
    dm = TextDataModule(str(small_text), block_size=T)
    train = dm.dataset("train").tensors[1].flatten()
    counts = torch.bincount(train, minlength=dm.in_features).double() + 1
    val = dm.dataset("val").tensors[1].flatten()
    expected = math.exp(-(counts / counts.sum()).log()[val].mean().item())
    assert dm.unigram_perplexity("val") == pytest.approx(expected, rel=1e-5)
    assert 10 < dm.unigram_perplexity("val") < dm.in_features  # better than uniform, far from perfect


# -- the nets ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("net_class", [CharTransformer, CharGRU])
def test_a_later_character_leaves_earlier_logits_exactly_unchanged(net_class: type[torch.nn.Module]) -> None:
    torch.manual_seed(0)
    net = net_class(30, 30).eval()
    x = torch.randint(0, 30, (3, 24))
    changed = x.clone()
    changed[:, 10] = (x[:, 10] + 1) % 30
    with torch.no_grad():
        before, after = net(x), net(changed)
    assert before.shape == (3, 24, 30)
    torch.testing.assert_close(after[:, :10], before[:, :10], rtol=0, atol=0)
    assert not torch.allclose(after[:, 10:], before[:, 10:])  # the change does reach the later positions


def test_an_untrained_transformer_starts_at_the_loss_of_uniform_guessing() -> None:
    torch.manual_seed(0)
    for vocabulary in (30, 104):
        net = CharTransformer(vocabulary, vocabulary, block_size=32, d_model=64, n_heads=4, n_layers=2)
        x, y = torch.randint(0, vocabulary, (2, 16, 32))
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        assert loss.item() == pytest.approx(math.log(vocabulary), abs=0.05)


def test_the_transformer_refuses_a_bad_shape_with_a_sentence() -> None:
    with pytest.raises(ValueError, match="d_model=30 must be a multiple of n_heads=4"):
        CharTransformer(10, 10, d_model=30, n_heads=4)


def test_the_loss_is_the_cross_entropy_per_character_and_perplexity_its_exp() -> None:
    torch.manual_seed(0)
    model = LanguageModel(in_features=12, out_features=12, net=CharGRU)
    x, y = torch.randint(0, 12, (2, 5, 7))
    output = model(x)
    expected = torch.stack(
        [F.cross_entropy(output[b, t], y[b, t]) for b in range(5) for t in range(7)]
    ).mean()
    torch.testing.assert_close(model.loss(output, y), expected)
    metrics = model.val_metrics
    metrics.update(*model.metric_inputs(output.detach(), y))
    values = metrics.compute()
    torch.testing.assert_close(values["val/perplexity"], expected.exp(), rtol=1e-5, atol=0)
    torch.testing.assert_close(values["val/acc"], (output.argmax(-1) == y).float().mean())
    predicted = model.predict_step((x,), 0)
    assert predicted["probs"].shape == (5, 12)
    torch.testing.assert_close(predicted["probs"], output[:, -1].softmax(-1))


# -- the loop's proofs, on text ----------------------------------------------------------------------------


class StopAt(Callback):
    """Stops the fit after the given optimizer step, as a crash would."""

    def __init__(self, step: int) -> None:
        self.step = step

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


EPOCHS, BATCHES = 2, 6


def resumable(text: Path, folder: Path) -> CLI:
    """Dropout on, shuffle on, AdamW; Resume keeps the dropout's generators in the checkpoint."""
    return main(
        [
            *tiny(text), *BARE, f"--trainer.default_root_dir={folder}",
            "--resume=src.extras.resume.Resume", "--trainer.logger=false",
            "--trainer.callbacks=[]",
            f"--trainer.max_epochs={EPOCHS}", f"--trainer.limit_train_batches={BATCHES}",
            "--trainer.limit_val_batches=2", *QUIET,
        ],
        run=False,
    )  # fmt: skip


def assert_same_weights(a: CLI, b: CLI, exact: bool = True) -> None:
    tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-6}
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, msg=name, **tolerance)


def test_resumed_in_the_middle_of_an_epoch_equals_uninterrupted(small_text: Path, workdir: Path) -> None:
    uninterrupted = resumable(small_text, workdir / "uninterrupted")
    uninterrupted.trainer.fit(uninterrupted.model, datamodule=uninterrupted.datamodule)
    first = resumable(small_text, workdir / "first")
    step = BATCHES + 3  # after the third batch of epoch 1
    first.trainer.callbacks.extend(
        [StopAt(step), ModelCheckpoint(workdir / "mid", "mid", every_n_train_steps=step)]
    )
    first.trainer.fit(first.model, datamodule=first.datamodule)
    middle = workdir / "mid" / "mid.ckpt"
    checkpoint = torch.load(middle, weights_only=True)
    assert (checkpoint["global_step"], checkpoint["epoch"]) == (step, 1)
    assert isinstance(first.trainer.train_dataloader, ResumableLoader)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == 3
    resumed = resumable(small_text, workdir / "resumed")
    resumed.trainer.callbacks.append(ModelCheckpoint(workdir / "again", "again", every_n_train_steps=step))
    resumed.trainer.fit(resumed.model, datamodule=resumed.datamodule, ckpt_path=str(middle))
    assert resumed.trainer.global_step == uninterrupted.trainer.global_step == EPOCHS * BATCHES
    assert_same_weights(resumed, uninterrupted)
    optimizers = (run.trainer.optimizers[0].state.values() for run in (resumed, uninterrupted))
    for a, b in zip(*optimizers, strict=True):
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    torch.testing.assert_close(
        resumed.trainer.callback_metrics["val/loss"], uninterrupted.trainer.callback_metrics["val/loss"]
    )
    # not vacuous: a run that took other batches ends elsewhere
    assert not torch.equal(first.model.net.head.weight, uninterrupted.model.net.head.weight)


SGD = [
    "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.5",
    "--model.init_args.optimizer.init_args.weight_decay=0", "--trainer.logger=false",
    "--trainer.callbacks=[]", "--trainer.enable_checkpointing=false",
]  # fmt: skip


@pytest.mark.slow
def test_accumulating_two_batches_equals_one_batch_twice_the_size(small_text: Path, workdir: Path) -> None:
    # the loader draws one permutation per epoch whatever the batch size; no dropout, no clipping
    common = [*tiny(small_text), *BARE, *SGD, "--config", str(TRAINER / "no_clip.yaml")]
    common += ["--model.init_args.net.init_args.dropout=0", "--trainer.max_epochs=2", *QUIET]
    small = main(
        [*common, "--trainer.accumulate_grad_batches=2", "--data.init_args.batch_size=8",
         "--trainer.limit_train_batches=6"],
        run=False,
    )  # fmt: skip
    big = main([*common, "--data.init_args.batch_size=16", "--trainer.limit_train_batches=3"], run=False)
    assert_same_weights(small, big)  # the same start
    start = small.model.net.head.weight.detach().clone()
    for run in (small, big):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    assert small.trainer.global_step == big.trainer.global_step == 6
    assert_same_weights(small, big, exact=False)  # float32 sums in another order
    assert not torch.allclose(start, big.model.net.head.weight)


def scale_loss_at(run: CLI, step: int, factor: float) -> None:
    real = run.model.loss

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = real(output, target)
        return value * factor if run.model.training and run.trainer.global_step == step else value

    run.model.loss = loss


@pytest.mark.slow
def test_a_nan_step_is_skipped_as_if_its_gradients_were_zero(small_text: Path, workdir: Path) -> None:
    def build() -> CLI:
        return main(
            [*tiny(small_text), *BARE, *SGD, "--nonfinite_guard=src.extras.guard.NonFiniteGuard",
             "--trainer.max_epochs=1", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1",
             *QUIET],
            run=False,
        )  # fmt: skip

    def fitted(factor: float) -> CLI:
        # built (which seeds the global generators) right before its fit: the dropout of a run must not
        # draw where another run's left off
        run = build()
        scale_loss_at(run, 2, factor)
        run.trainer.fit(run.model, datamodule=run.datamodule)
        return run

    skipped = fitted(math.nan)
    zeroed = fitted(0.0)  # plain SGD: zero gradients leave the weights where they were
    guard = next(c for c in skipped.trainer.callbacks if isinstance(c, NonFiniteGuard))
    assert guard.skipped == 1
    assert skipped.trainer.global_step == 5
    assert_same_weights(skipped, zeroed)
    assert all(torch.isfinite(p).all() for p in skipped.model.parameters())


SEED = 42  # defaults.yaml's seed_everything: Lightning's DistributedSampler is seeded with it
B = 8


class RankReport(Callback):
    """Each process saves its final weights."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        torch.save(
            {"weights": weights, "step": trainer.global_step}, self.folder / f"rank{trainer.global_rank}.pt"
        )


class SameOrderAsTwoProcesses(TextDataModule):
    """One process, batches of 2B: positions ``[2Bt, 2B(t+1))`` of the permutation two DDP processes
    share at step ``t`` (rank ``r`` takes positions ``r::2`` of it)."""

    @override
    def train_dataloader(self) -> DataLoader:
        dataset = self.dataset("train")
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=SEED)
        return DataLoader(dataset, batch_size=2 * B, sampler=sampler, collate_fn=keep_batch)


def test_ddp_two_processes_equal_one_process_with_twice_the_batch(small_text: Path, workdir: Path) -> None:
    """In-process DDP on the CPU with ``ddp_fork``, as tests/test_distributed.py does: ``ddp_spawn``
    hands the model to its processes through shared memory, which this sandbox refuses (the shipped
    tabular configs fail there the same way)."""
    common = [
        *tiny(small_text), *BARE, *SGD, "--model.init_args.net.init_args.dropout=0", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=4", "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=1", *QUIET,
    ]  # fmt: skip
    two = main(
        [*common, "--config", str(TRAINER / "ddp.yaml"), "--trainer.strategy=ddp_fork",
         f"--data.init_args.batch_size={B}"],
        run=False,
    )  # fmt: skip
    assert two.trainer.world_size == 2
    two.trainer.callbacks.append(RankReport(workdir))
    two.trainer.fit(two.model, datamodule=two.datamodule)
    ranks = [torch.load(workdir / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, tensor in ranks[0]["weights"].items():  # same start, same averaged gradients
        assert torch.equal(tensor, ranks[1]["weights"][name]), name
    one = main([*common, f"--data.init_args.batch_size={2 * B}"], run=False)
    arguments = {k: v for k, v in one.datamodule.hparams.items() if not k.startswith("_")}
    one.trainer.fit(one.model, datamodule=SameOrderAsTwoProcesses(**arguments))
    assert one.trainer.global_step == ranks[0]["step"] == 4
    reference = {k: v for k, v in one.model.state_dict().items() if k in ranks[0]["weights"]}
    torch.testing.assert_close(ranks[0]["weights"], reference, rtol=1e-5, atol=1e-6)


# -- the CLI and generation from the checkpoint alone ------------------------------------------------------


def test_text_samples_land_in_tensorboard_on_the_nth_and_the_last_epoch(trained_charlm: CLI) -> None:
    events = EventAccumulator(trained_charlm.trainer.log_dir, size_guidance={"tensors": 0}).Reload()
    samples = events.Tensors("generated/text/text_summary")
    assert [s.step for s in samples] == [9, 19]  # the last step of epochs 0 and 1
    text = make_ndarray(samples[-1].tensor_proto).item().decode()
    heading, fence, body = text.split("\n", 2)
    assert heading == "epoch 1, sample, temperature 0.8"
    assert fence == ""
    assert body.startswith("```\nThe ")
    assert len(body.removeprefix("```\n").removesuffix("\n```")) == len("The ") + 20


def test_validate_from_the_checkpoint_alone_gives_the_fits_numbers(trained_charlm: CLI, cli) -> None:
    evaluated = cli("validate", "--ckpt_path", str(last_checkpoint(trained_charlm)))
    assert isinstance(evaluated.datamodule, TextDataModule)
    assert evaluated.datamodule.preprocessing_from == str(last_checkpoint(trained_charlm))
    fitted, again = trained_charlm.trainer.callback_metrics, evaluated.trainer.callback_metrics
    torch.testing.assert_close(again["val/loss"], fitted["val/loss"], rtol=0, atol=0)
    torch.testing.assert_close(again["val/perplexity"], again["val/loss"].exp(), rtol=1e-5, atol=0)


def test_the_fit_prints_the_unigram_baseline_it_must_beat(small_text: Path, workdir: Path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        run = main(["fit", *tiny(small_text), "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                    "--trainer.logger=false", "--trainer.enable_checkpointing=false",
                    "--trainer.callbacks=[]", *QUIET])  # fmt: skip
    perplexity = run.datamodule.unigram_perplexity("val")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Unigram baseline")]
    assert said == [
        f"Unigram baseline on data.path={str(small_text)!r} (each character's frequency in the training "
        f"stretch, no context): val/loss {math.log(perplexity):.3f} nats, val/perplexity {perplexity:.1f}; "
        "a model that reads the context ends below it."
    ]
    assert perplexity > 10  # a figure with something to beat


# -- the benchmark's machinery -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_shipped_config_beats_the_unigram_baseline_by_far(cli) -> None:
    """configs/charlm.yaml as make train runs it: 6 to 8.5 minutes on two idle cores."""
    run = cli("fit", "--config", "charlm.yaml")
    metrics = run.trainer.callback_metrics
    unigram = run.datamodule.unigram_perplexity("val")
    assert unigram > 20
    assert metrics["val/perplexity"] < unigram / 4
    torch.testing.assert_close(metrics["val/perplexity"], metrics["val/loss"].exp(), rtol=1e-4, atol=0)


@pytest.mark.parametrize(("setting", "sentence"), data_tests.REFUSED)
def test_every_shipped_datamodule_refuses_loader_and_split_settings_alike(
    setting: dict[str, Any], sentence: str
) -> None:
    """As the table's DataModule does (src/extras/tables/test_data.py)."""
    data_tests.assert_refused(TextDataModule, setting, sentence)
