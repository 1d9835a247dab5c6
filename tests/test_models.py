"""The tasks' steps, losses, metrics and predictions, checked against direct computations."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score, mean_absolute_error, r2_score

from src.models import Classifier, Regressor
from src.nets import MLP

# these tests call the steps directly, without a Trainer, so self.log() has nowhere to go and says so
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")


def test_mlp_registers_every_layer_and_shapes() -> None:
    net = MLP(5, 3, hidden_sizes=[8, 4], dropout=0.1, batch_norm=True)
    # 5*8 (no bias before BatchNorm) + 2*8 BN, 8*4 + 2*4 BN, head 4*3+3
    assert sum(p.numel() for p in net.parameters()) == 40 + 16 + 32 + 8 + 15
    assert net(torch.randn(7, 5)).shape == (7, 3)
    assert sum(isinstance(m, torch.nn.Dropout) for m in net.modules()) == 2
    assert MLP(5, 1, hidden_sizes=[]).head.in_features == 5
    with pytest.raises(ValueError, match="activation 'swish' is unknown"):
        MLP(5, 1, activation="swish")


def test_classifier_loss_is_cross_entropy_of_raw_logits() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8], label_smoothing=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loss = model.training_step((x, y), 0)
    logits = model.net(x)
    torch.testing.assert_close(loss, F.cross_entropy(logits, y, label_smoothing=0.1))
    # softmaxing first would be a different (and wrong) number
    assert not torch.allclose(loss, F.cross_entropy(logits.softmax(-1), y, label_smoothing=0.1))


def test_classifier_class_weights_enter_the_loss() -> None:
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8], class_weights=True)
    model.class_weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    expected = F.cross_entropy(model.net(x), y, weight=torch.tensor([1.0, 2.0, 0.5]))
    torch.testing.assert_close(model.loss(model.net(x), y), expected)


def test_classifier_epoch_metrics_match_sklearn() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8])
    batches = [(torch.randn(10, 4), torch.randint(0, 3, (10,))) for _ in range(3)]
    preds, targets = [], []
    for x, y in batches:
        model.test_step((x, y), 0)
        preds.append(model.net(x).argmax(-1))
        targets.append(y)
    p, t = torch.cat(preds).numpy(), torch.cat(targets).numpy()
    computed = model.test_metrics.compute()
    assert computed["test/acc"].item() == pytest.approx((p == t).mean())
    assert computed["test/f1"].item() == pytest.approx(f1_score(t, p, average="macro", labels=[0, 1, 2]))
    assert model.test_loss.compute().item() == pytest.approx(
        np.mean([F.cross_entropy(model.net(x), y).item() for x, y in batches]), rel=1e-5
    )


def test_classifier_predicts_probabilities_and_labels() -> None:
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8]).eval()
    out = model.predict_step((torch.randn(6, 4), torch.zeros(6)), 0)
    torch.testing.assert_close(out["probs"].sum(-1), torch.ones(6))
    torch.testing.assert_close(out["preds"], out["probs"].argmax(-1))


@pytest.mark.parametrize("loss_fn", ["mse", "huber"])
def test_regressor_trains_on_standardized_targets_and_reports_original_units(loss_fn: str) -> None:
    torch.manual_seed(0)
    model = Regressor(in_features=3, out_features=1, hidden_sizes=[8], loss_fn=loss_fn, huber_delta=0.5)
    model.target_mean.fill_(100.0)
    model.target_std.fill_(20.0)
    x, y = torch.randn(12, 3), 100 + 20 * torch.randn(12)
    out = model.net(x)  # (B, 1), standardized units
    expected_loss = (
        F.mse_loss(out.squeeze(-1), (y - 100) / 20)
        if loss_fn == "mse"
        else F.huber_loss(out.squeeze(-1), (y - 100) / 20, delta=0.5)
    )
    torch.testing.assert_close(model.training_step((x, y), 0), expected_loss)
    preds = model.predict_step((x,), 0)["preds"]
    torch.testing.assert_close(preds, out.squeeze(-1) * 20 + 100)
    model.test_step((x, y), 0)
    m = model.test_metrics.compute()
    p, t = preds.detach().numpy(), y.numpy()
    assert m["test/mae"].item() == pytest.approx(mean_absolute_error(t, p), rel=1e-5)
    assert m["test/rmse"].item() == pytest.approx(np.sqrt(np.mean((t - p) ** 2)), rel=1e-5)
    assert m["test/r2"].item() == pytest.approx(r2_score(t, p), rel=1e-4)


def test_hyperparameters_are_primitives() -> None:
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8], label_smoothing=0.1)
    assert dict(model.hparams) == {
        "in_features": 4,
        "out_features": 3,
        "hidden_sizes": [8],
        "activation": "relu",
        "dropout": 0.0,
        "batch_norm": False,
        "scheduler_interval": "epoch",
        "scheduler_monitor": "val/loss",
        "compile_net": False,
        "activation_checkpointing": False,
        "label_smoothing": 0.1,
        "class_weights": False,
    }
