"""Lightning's ModelCheckpoint, with the one file an interrupted top-k update can leave behind removed."""

import re
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override


class TopKCheckpoint(ModelCheckpoint):
    """Keeps the best ``save_top_k`` checkpoints by ``monitor``, and never more once a run resumes.

    Lightning writes a new best checkpoint before it deletes the one it displaces, so a run killed
    between the two leaves ``k + 1`` files. When a fit resumes, this callback's restored state says
    which files its top ``k`` are; a file in its folder that matches its ``filename`` pattern, is tracked
    by no checkpoint callback and was written after the checkpoint being resumed is that leftover (or
    from the part of a run the resume goes back over), and is removed with a one-line notice. Files
    older than the resumed checkpoint are left alone, as are files that other runs left in the folder.

    Arguments are ``ModelCheckpoint``'s.
    """

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, not in on_fit_start: under some strategies Lightning restores callbacks after that hook
        super().on_train_start(trainer, pl_module)
        resumed = trainer.ckpt_path
        if resumed is None or self.monitor is None or self.save_top_k < 1 or self.dirpath is None:
            return
        if not trainer.is_global_zero or not Path(resumed).is_file():
            return
        tracked = set()
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                paths = [*callback.best_k_models, callback.best_model_path, callback.last_model_path]
                tracked |= {Path(path).resolve() for path in paths if path}
        since = Path(resumed).stat().st_mtime
        leftovers = sorted(
            path
            for path in Path(self.dirpath).glob(f"*{self.FILE_EXTENSION}")
            if self._pattern().fullmatch(path.name)
            and path.resolve() not in tracked
            and path.resolve() != Path(resumed).resolve()
            and path.stat().st_mtime > since
        )
        for path in leftovers:
            trainer.strategy.remove_checkpoint(path)
        if leftovers:
            rank_zero_info(
                f"Removed {', '.join(p.name for p in leftovers)} from {self.dirpath}: written after "
                f"{Path(resumed).name} by the interrupted run, beyond its best {self.save_top_k}."
            )

    def _pattern(self) -> re.Pattern[str]:
        """The names this callback writes: its ``filename`` template with every ``{...}`` field as a
        wildcard (field names inserted before them are matched too), a version counter, the extension."""
        template = self.filename or "{epoch}-{step}"
        literal = [re.escape(part) for part in re.split(r"\{[^}]*\}", template)]
        return re.compile(".+".join(literal) + rf"(-v\d+)?{re.escape(self.FILE_EXTENSION)}")
