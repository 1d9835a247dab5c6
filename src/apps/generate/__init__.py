"""Text from a trained character language model, from its checkpoint alone.

    python -m src.apps.generate --ckpt_path CKPT --prompt "def " --strategy sample --temperature 0.8 \\
        --top_k 40 --top_p 0.95 --max_new_tokens 300 --seed 0 [--output sample.txt [--overwrite]]

The checkpoint is read as data (:func:`src.checkpoints.load_checkpoint`), the classes it names are
checked before anything is imported (:func:`src.checkpoints.check_names`), the model is rebuilt from
it, on a GPU when there is one (``--accelerator``), and the vocabulary is the one its run fitted. The
prompt is printed, then each generated character as it comes, or the whole text is written to
``--output`` (whole or not at all; an existing file only with ``--overwrite``). The same seed gives the
same text; ``greedy`` needs none. On the CPU, torch uses ``--threads`` threads (1, as the ``cpu_threads``
section gives every other command: a forward pass of one window is faster on one thread than split).
``--max_new_tokens`` is bounded by ``--token_limit`` (100000 unless raised), so that a slip of the finger
cannot start a run of hours.
"""

import signal
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, NoReturn

import torch
from jsonargparse import ArgumentParser, auto_cli
from typing_extensions import override

from src.checkpoints import check_names, load_checkpoint, model_class_name, resolve
from src.cli_errors import summarize
from src.errors import UserInputError
from src.extras.text import Vocabulary, read_text, text_state_of, vocabulary_of
from src.extras.text.decoding import Strategy, check_decoding, stream
from src.extras.text.model import LanguageModel
from src.files import check_output, written

#: the prompt when none is given: the start of a line
DEFAULT_PROMPT = "\n"
#: the most characters one command generates unless --token_limit raises it: minutes on a CPU, not days
TOKEN_LIMIT = 100_000


#: where the model can run; auto: a GPU when torch sees one, else the CPU
Accelerator = Literal["auto", "cpu", "cuda"]


def device_of(accelerator: Accelerator) -> torch.device:
    """The device ``accelerator`` names, or one sentence when it names a GPU torch does not see."""
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--accelerator cuda needs a CUDA GPU, and torch sees none; pass auto or cpu.")
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(accelerator)


def load(ckpt_path: str, device: torch.device | str = "cpu") -> tuple[LanguageModel, Vocabulary, int]:
    """A language model checkpoint → the model (on ``device``, in eval mode), its vocabulary and the window
    length it was trained on; one sentence for a checkpoint that is none."""
    checkpoint = load_checkpoint(ckpt_path)
    check_names(checkpoint, ckpt_path)
    class_path = model_class_name(checkpoint)
    found = resolve(class_path) if class_path is not None else None
    if not (isinstance(found, type) and issubclass(found, LanguageModel)):
        raise UserInputError(
            f"checkpoint {ckpt_path!r} is not a language model (it holds {class_path or 'no model class'}); "
            "pass a checkpoint of a run of configs/charlm.yaml."
        )
    state = text_state_of(checkpoint, ckpt_path)
    try:
        # Lightning's loader rebuilds the net from the config it was saved as; compiling pays off in
        # training, not in one forward pass per character
        model = found.load_from_checkpoint(ckpt_path, map_location=device, compile_net=False)
    except UserInputError:
        raise
    except (TypeError, RuntimeError, ValueError) as err:  # other arguments, or other weights
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserInputError(f"checkpoint {ckpt_path!r} cannot be loaded ({first.rstrip('.')}).") from err
    return model.eval(), vocabulary_of(checkpoint, ckpt_path), int(state["block_size"])


def checked(
    strategy: str,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    max_new_tokens: int,
    seed: int,
    token_limit: int,
    vocabulary: int | None = None,
) -> None:
    """:func:`src.extras.text.decoding.check_decoding`, its sentence naming the option (``--top_k=...``)."""
    try:
        check_decoding(
            strategy,
            temperature,
            top_k,
            top_p,
            max_new_tokens,
            vocabulary=vocabulary,
            seed=seed,
            token_limit=token_limit,
        )
    except UserInputError as err:
        raise UserInputError(f"--{str(err).replace('(token_limit)', '(--token_limit)')}") from err


def generate_text(
    ckpt_path: str,
    prompt: str = DEFAULT_PROMPT,
    prompt_file: str | None = None,
    strategy: Strategy = "sample",
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int = 300,
    token_limit: int = TOKEN_LIMIT,
    seed: int = 0,
    output: str | None = None,
    overwrite: bool = False,
    accelerator: Accelerator = "auto",
    threads: int | None = 1,
) -> None:
    """Generate text from a character language model checkpoint.

    Args:
        ckpt_path: The checkpoint (a .ckpt file of a run of configs/charlm.yaml).
        prompt: The text to continue; left out, a line break.
        prompt_file: A UTF-8 file whose text to continue; it replaces --prompt.
        strategy: greedy (always the likeliest character) or sample.
        temperature: Divides the logits before sampling: below 1 safer, above 1 wilder; 0 is greedy.
        top_k: Sample among the top_k likeliest characters only (at most the vocabulary's size).
        top_p: Sample among the smallest set of likeliest characters whose probability reaches top_p.
        max_new_tokens: Characters to generate (at most --token_limit).
        token_limit: The most characters --max_new_tokens may ask for (default 100000).
        seed: Seeds the sampling (0 to 2**64 - 1): the same seed gives the same text.
        output: Write the text to this file instead of printing it as it comes.
        overwrite: Replace --output if it exists.
        accelerator: Where the model runs: auto (a GPU when there is one, else the CPU), cpu or cuda.
        threads: torch's threads on the CPU (default 1, as every other command; null: one per core).
    """
    checked(strategy, temperature, top_k, top_p, max_new_tokens, seed, token_limit)
    if threads is not None and threads < 1:
        raise UserInputError(f"--threads={threads} must be at least 1, or null for torch's default.")
    device = device_of(accelerator)
    if output is not None:
        check_output(output, [ckpt_path, prompt_file], overwrite)
    if prompt_file is not None:
        prompt = read_text(prompt_file, "--prompt_file")
    if not prompt:
        raise UserInputError("--prompt is empty; give at least one character to continue.")
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        model, vocabulary, block_size = load(ckpt_path, device)
        checked(strategy, temperature, top_k, top_p, max_new_tokens, seed, token_limit, len(vocabulary))
        prompt_ids = vocabulary.encode(prompt)
        unknown = sorted({c for c, i in zip(prompt, prompt_ids.tolist(), strict=True) if i == 0})
        if unknown:
            print(
                f"note: the prompt's {unknown} are not in the vocabulary and read as unknown.",
                file=sys.stderr,
            )
        steps = stream(
            model, prompt_ids, max_new_tokens, strategy, temperature, top_k, top_p, seed, block_size
        )
        emit(prompt, steps, vocabulary, output)
    finally:
        torch.set_num_threads(before)  # as CpuThreads does after a run: a caller in Python keeps its own


def emit(prompt: str, steps: Iterable[torch.Tensor], vocabulary: Vocabulary, output: str | None) -> None:
    """The prompt as given, then the generated characters (an unknown one of the prompt stays itself):
    printed as each comes, or written to ``output`` whole, once all have come."""
    if output is None:
        sys.stdout.write(prompt)
        for step in steps:
            sys.stdout.write(vocabulary.decode([int(step)]))
            sys.stdout.flush()
        sys.stdout.write("\n")
        return
    text = prompt + vocabulary.decode([int(step) for step in steps])
    with written(Path(output)) as (partial,):
        partial.write_text(text, encoding="utf-8")
    print(f"{len(text)} characters written to {output}", file=sys.stderr)


class _Parser(ArgumentParser):
    """jsonargparse's parser, whose complaints are one sentence and exit status 2."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse parsing a nested value: it catches this and goes on
            super().error(message, ex)
        raise UserInputError(f"{summarize(message)}; see python -m src.apps.generate --help")


def main(args: Sequence[str] | None = None) -> None:
    """Run the command; bad input ends with one sentence on stderr and exit status 2."""
    try:
        auto_cli(
            generate_text,
            args=list(args) if args is not None else None,
            as_positional=False,
            parser_class=_Parser,
        )
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    except KeyboardInterrupt as err:  # Ctrl+C while generating: what was printed stays, no file is left
        print(file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from err
