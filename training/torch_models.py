"""The models of ``training.models`` as PyTorch modules, layer for layer.

The same names, default input shapes and recipes (optimizer, learning rate, warm-up, global
batch) as the Keras ones, so a run's parameters mean the same under either framework. Each
module takes torch's ``(batch, channels, height, width)`` float images in [0, 1]
(``torch_images`` makes them from the stored ones) and returns logits (Keras' models end in a
softmax; torch's cross-entropy takes logits).
The paper's MNIST CNN, the digits MLP, and VGG16 as ``keras.applications`` builds it without
its top (the paper's Caltech101 network; from random initial weights: nothing is staged for
torch, so no ImageNet base, as ``weights_source: "keras:weights=None"``).
"""

from __future__ import annotations

from hvdflow.training.models import model_input_shape
from hvdflow.training.optimizers import SGD_MOMENTUM

TORCH_MODELS = ("digits_mlp", "mnist_cnn", "vgg16")
# keras.applications.VGG16's convolutions: channels of each 3x3 layer, "M" a 2x2 max pool.
_VGG16_LAYERS = (
    *(64, 64, "M", 128, 128, "M"),
    *(256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
)


def build_torch_model(name: str, input_shape, num_classes: int, seed: int | None = None):
    """An initialised ``torch.nn.Module``; ``seed`` makes its initial weights reproducible."""
    key = name.lower()
    if key not in TORCH_MODELS:
        raise ValueError(
            f"model {name!r} has no PyTorch version: training.framework 'torch' trains "
            f"{', '.join(TORCH_MODELS[:-1])} or {TORCH_MODELS[-1]}; the others train with "
            "framework 'tensorflow'"
        )
    import torch

    height, width, channels = model_input_shape(input_shape)
    if seed is not None:
        torch.manual_seed(seed)
    nn = torch.nn
    if key == "digits_mlp":
        layers = [
            nn.Flatten(),
            nn.Linear(height * width * channels, 32),
            nn.ReLU(),
            nn.Linear(32, num_classes),
        ]
    elif key == "vgg16":
        layers = [*_vgg16_features(channels), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        layers.append(nn.Linear(512, num_classes))  # pooling="avg", then the new head
    else:  # mnist_cnn: Databricks' HorovodRunner example, as training.models builds it
        flat = 64 * ((height - 4) // 2) * ((width - 4) // 2)
        layers = [
            nn.Conv2d(channels, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(flat, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, num_classes),
        ]
    return nn.Sequential(*layers)


def _vgg16_features(channels: int) -> list:
    import torch

    nn, layers = torch.nn, []
    for width in _VGG16_LAYERS:
        if width == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU()]
            channels = width
    return layers


def torch_images(images):
    """Stored images (uint8 ``(n, height, width)`` or ``(n, height, width, channels)``) as the
    models take them: float32 in [0, 1], ``(n, channels, height, width)``."""
    import torch

    tensor = torch.from_numpy(images).float().div_(255.0)
    if tensor.dim() == 3:
        return tensor.unsqueeze(1)
    return tensor.permute(0, 3, 1, 2).contiguous()


def make_torch_optimizer(name: str, parameters, learning_rate: float):
    """The optimizer ``training.optimizers.make_optimizer`` makes in Keras, in torch, with
    Keras' defaults where torch's differ (Adam's epsilon)."""
    import torch

    key = name.lower()
    if key == "adam":
        return torch.optim.Adam(parameters, lr=learning_rate, eps=1e-7)
    if key == "sgd":
        return torch.optim.SGD(parameters, lr=learning_rate, momentum=SGD_MOMENTUM)
    if key == "adadelta":
        return torch.optim.Adadelta(parameters, lr=learning_rate, rho=0.95, eps=1e-7)
    raise ValueError(
        f"optimizer {name!r} has no PyTorch version here: expected adam, sgd or adadelta"
    )
