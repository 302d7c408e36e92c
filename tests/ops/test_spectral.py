"""Discrete Fourier transforms (torch.fft, stft) on `tpu` against CPU PyTorch, with gradients."""

import pytest
import torch

from torch_tpu.testing.compare import check_op


def real(*shape):
    return torch.randn(shape).requires_grad_()


def cplx(*shape):
    return torch.randn(shape, dtype=torch.complex64).requires_grad_()


# (id, fn, input)
TRANSFORMS = [
    ("fft", lambda x: torch.fft.fft(x), lambda: real(3, 8)),
    ("fft_complex_norm_ortho", lambda x: torch.fft.fft(x, norm="ortho"), lambda: cplx(3, 8)),
    ("fft_padded", lambda x: torch.fft.fft(x, n=10, dim=0), lambda: real(6, 3)),
    ("ifft_forward", lambda x: torch.fft.ifft(x, norm="forward"), lambda: cplx(5)),
    ("fft2", lambda x: torch.fft.fft2(x), lambda: cplx(2, 4, 6)),
    ("ifftn", lambda x: torch.fft.ifftn(x, dim=(0, 2)), lambda: cplx(4, 3, 5)),
    ("rfft", lambda x: torch.fft.rfft(x), lambda: real(2, 9)),
    ("rfftn_ortho", lambda x: torch.fft.rfftn(x, norm="ortho"), lambda: real(4, 6)),
    ("irfft", lambda x: torch.fft.irfft(x), lambda: cplx(3, 5)),
    ("irfft_odd", lambda x: torch.fft.irfft(x, n=9), lambda: cplx(5)),
    ("irfft2", lambda x: torch.fft.irfft2(x, norm="forward"), lambda: cplx(4, 3)),
    ("hfft", lambda x: torch.fft.hfft(x), lambda: cplx(6)),
    ("ihfft", lambda x: torch.fft.ihfft(x), lambda: real(3, 7)),
    ("fftshift", lambda x: torch.fft.ifftshift(torch.fft.fftshift(x, dim=1) * 2), lambda: real(3, 5)),
    (
        "stft",
        lambda x: torch.stft(x, 8, hop_length=2, window=torch.hann_window(8, device=x.device), return_complex=True),
        lambda: real(2, 32),
    ),
]


def as_real(fn):
    """`fn` with a complex result seen as real pairs (check_op seeds real gradients only)."""

    def run(x):
        out = fn(x)
        return torch.view_as_real(out.resolve_conj()) if out.is_complex() else out

    return run


@pytest.mark.parametrize("fn, make", [pytest.param(fn, make, id=name) for name, fn, make in TRANSFORMS])
def test_transform(fn, make):
    check_op(as_real(fn), make(), grad=True)


def test_istft_round_trip():
    window = torch.hann_window(8)
    spectrum = torch.stft(torch.randn(40), 8, hop_length=2, window=window, return_complex=True)
    check_op(lambda s, w: torch.istft(s, 8, hop_length=2, window=w, length=40), spectrum, window)
