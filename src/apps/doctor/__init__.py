"""The loop doctor: checks a user's own model, data and config for the silent bugs of the PyTorch tutorials.

    make doctor CONFIG=configs/digits.yaml          # = python -m src.apps.doctor --config configs/digits.yaml

builds the model, data and Trainer exactly as ``make train`` would (further ``--config`` files and
``--key value`` overrides included), runs short probes on copies (:mod:`src.apps.doctor.probe`),
prints one line per :class:`Finding` and exits with status 1 when something is wrong, 0 when all is
clean. The same checks watch any real run through the :class:`~src.apps.doctor.Doctor` callback.

The checks live by subject: :mod:`src.apps.doctor.data` (the encoded tensors),
:mod:`src.apps.doctor.model` (the module and its first steps), :mod:`src.apps.doctor.schedule` (the LR
over the run's real length). The core (data, models, nets, cli) knows nothing of the doctor.
"""

from src.apps.doctor.callback import Doctor
from src.apps.doctor.findings import Finding
from src.apps.doctor.probe import examine

__all__ = ["Doctor", "Finding", "examine"]
