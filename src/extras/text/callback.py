"""Generated text in TensorBoard's Text tab while a language model trains."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from src.errors import UserInputError
from src.extras.loggers import logging_step, tensorboard_writer
from src.extras.pacing import Pace
from src.extras.text.decoding import Strategy, check_decoding, generate


class TextSamples(Callback):
    """Writes a sample that the model generates from ``prompt`` to TensorBoard (tag ``generated/text``: the
    Text tab's first section, above the run's config).

    On every ``every_n_epochs``-th validation epoch of a fit (counting from epoch 0) while the samples
    take at most ``max_share`` of the fit's time (on short epochs some are left out), and on the last one,
    whatever ended the fit. The text sits in a code block, so that its spaces and line breaks show as
    generated. Works with any LightningModule whose forward maps ``(B, T)`` ids to ``(B, T, V)`` logits,
    and a DataModule with ``encode(text)``, ``decode(ids)`` and ``block_size`` (the context is cropped
    to it): :class:`src.extras.text.TextDataModule`. Others get one line saying so, and no samples.

    Args:
        prompt: The text the sample starts from (at least one character).
        every_n_epochs: Write a sample on every n-th validation epoch (and on the last).
        max_share: The most of the fit's time that writing samples may take
            (:class:`~src.extras.pacing.Pace`); ``None``: no limit.
        max_new_tokens: Characters to generate.
        strategy: ``greedy`` or ``sample`` (see :func:`src.extras.text.decoding.next_token`).
        temperature: Sampling temperature; 0 is greedy.
        top_k: Sample among the ``top_k`` likeliest characters only.
        top_p: Sample among the nucleus of probability ``top_p`` only.
        seed: Seeds the sampling, so that samples of different epochs differ by the model alone.
        tag: The tag in the Text tab.
    """

    def __init__(
        self,
        prompt: str = "\n",
        every_n_epochs: int = 1,
        max_share: float | None = 0.05,
        max_new_tokens: int = 300,
        strategy: Strategy = "sample",
        temperature: float = 0.8,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        tag: str = "generated/text",
    ) -> None:
        if every_n_epochs < 1:
            raise UserInputError(f"TextSamples every_n_epochs={every_n_epochs} must be at least 1.")
        if not prompt:
            raise UserInputError("TextSamples prompt is empty; give at least one character to start from.")
        try:
            check_decoding(strategy, temperature, top_k, top_p, max_new_tokens)
        except UserInputError as err:
            raise UserInputError(f"TextSamples {err}") from err
        self.prompt, self.every_n_epochs, self.max_new_tokens = prompt, every_n_epochs, max_new_tokens
        self.strategy, self.temperature, self.top_k, self.top_p = strategy, temperature, top_k, top_p
        self.seed, self.tag = seed, tag
        self._pace = Pace(max_share, "TextSamples")
        self._last_epoch: int | None = None  # the latest validation epoch of this fit, once seen
        self._sampled: int | None = None  # the epoch of the latest sample written
        self._told = False

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._last_epoch = trainer.current_epoch
        if trainer.current_epoch % self.every_n_epochs == 0 and self._pace.due(trainer):
            with self._pace.running():
                self._write(trainer, pl_module, trainer.current_epoch)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the fit's last validation epoch, whatever ended the fit (max_epochs, early stopping, a signal)
        # (the Trainer's current_epoch has moved on past it by now)
        if self._last_epoch is not None and self._sampled != self._last_epoch:
            self._write(trainer, pl_module, self._last_epoch)
        self._last_epoch = self._sampled = None
        self._pace.reset()

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> None:
        self._sampled = epoch
        datamodule: Any = trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning at run time
        if not all(hasattr(datamodule, name) for name in ("encode", "decode", "block_size")):
            if not self._told:
                self._told = True
                rank_zero_info(
                    f"TextSamples needs a DataModule with encode, decode and block_size; "
                    f"{type(datamodule).__name__} has not all of them, so no samples are written."
                )
            return
        if not any(isinstance(logger, TensorBoardLogger) for logger in trainer.loggers):
            return  # nowhere to write (fast_dev_run, or logger: false), on every process alike
        # generated on every process (a sharded net gathers its weights in forward, on all of them at
        # once), written by the one that writes
        ids = generate(
            pl_module,
            datamodule.encode(self.prompt),
            self.max_new_tokens,
            self.strategy,
            self.temperature,
            self.top_k,
            self.top_p,
            self.seed,
            datamodule.block_size,
        )
        writer = tensorboard_writer(trainer)
        if writer is not None:
            text = datamodule.decode(ids).replace("```", "` ` `")  # a fence in the text would end the block
            heading = f"epoch {epoch}, {self.strategy}, temperature {self.temperature}"
            writer.add_text(self.tag, f"{heading}\n\n```\n{text}\n```", logging_step(trainer))
