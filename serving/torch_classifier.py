"""The registered model of a PyTorch training: the same pyfunc as ``classifier.ImageClassifier``
(image files in, class names out, the same params and output columns), over a TorchScript
network.

TorchScript carries the architecture with the weights, so loading it needs torch alone, never
hvdflow's model code; this class and ``classifier`` and ``images`` travel inside the model,
pickled by value (``hvdflow.serving.package``).
"""

from __future__ import annotations

import numpy as np

from hvdflow.serving.classifier import PREDICT_CHUNK, ImageClassifier

TORCHSCRIPT_ARTIFACT = "torchscript_model"  # the artifacts key of the TorchScript file


class TorchImageClassifier(ImageClassifier):
    """``ImageClassifier`` whose network is a TorchScript module that takes torch's (batch,
    channels, height, width) and returns logits."""

    def load_context(self, context) -> None:
        import torch

        self.network = torch.jit.load(context.artifacts[TORCHSCRIPT_ARTIFACT], map_location="cpu")
        self.network.eval()

    def probabilities(self, batch: np.ndarray) -> np.ndarray:
        """Class probabilities for prepared inputs (batch, height, width, channels), float32 in
        [0, 1], as the Keras classifier takes them."""
        import torch

        if len(batch) == 0:
            return np.zeros((0, len(self.labels)), np.float32)
        parts = []
        with torch.no_grad():
            for i in range(0, len(batch), PREDICT_CHUNK):
                images = torch.from_numpy(np.ascontiguousarray(batch[i : i + PREDICT_CHUNK]))
                logits = self.network(images.float().permute(0, 3, 1, 2).contiguous())
                parts.append(torch.softmax(logits, dim=1).numpy())
        return np.concatenate(parts)
