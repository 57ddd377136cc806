"""ToTensorImage, Resize, GrayScale, CenterCrop: layouts, values, leading dims, bad images."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.transforms import CenterCrop, GrayScale, Resize, ToTensorImage


def pixels_td(shape, dtype=torch.uint8, batch=None, seed=0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, shape, generator=g).to(dtype)
    batch = list(shape[:-3]) if batch is None else batch
    return TensorDict({"pixels": pixels, ("next", "pixels"): pixels.clone()}, batch)


class TestToTensorImage:
    @pytest.mark.parametrize("shape", [(6, 5, 3), (4, 6, 5, 3), (2, 3, 6, 5, 1)])
    def test_layout_and_values(self, shape):
        td = pixels_td(shape)
        src = td["pixels"].clone()
        out = ToTensorImage(in_keys=["pixels", ("next", "pixels")])(td)
        for key in ("pixels", ("next", "pixels")):
            img = out[key]
            assert img.shape == (*shape[:-3], shape[-1], shape[-3], shape[-2])
            assert img.dtype == torch.float32 and img.is_contiguous()
            assert torch.allclose(img, src.movedim(-1, -3).float() / 255)

    def test_int64_input_like_torch_randint(self):
        td = TensorDict({"pixels": torch.randint(255, (10, 8, 8, 3))}, [10])
        out = ToTensorImage()(td)["pixels"]
        assert out.shape == (10, 3, 8, 8) and 0 <= out.min() and out.max() <= 1

    def test_float_input_is_not_rescaled_unless_asked(self):
        img = torch.rand(2, 4, 4, 3)
        out = ToTensorImage()(TensorDict({"pixels": img}, [2]))["pixels"]
        assert torch.equal(out, img.movedim(-1, -3))
        out = ToTensorImage(from_int=True)(TensorDict({"pixels": img.clone()}, [2]))["pixels"]
        assert torch.allclose(out, img.movedim(-1, -3) / 255)

    def test_single_channel_float_does_not_touch_the_caller_tensor(self):
        img = torch.full((2, 4, 4, 1), 255.0)
        ToTensorImage(from_int=True)(TensorDict({"pixels": img}, [2]))
        assert img.eq(255).all()

    def test_dtype_unsqueeze_out_keys(self):
        td = pixels_td((6, 5, 3), batch=[])
        out = ToTensorImage(unsqueeze=True, dtype=torch.float64, out_keys=["img"])(td)
        assert out["img"].shape == (1, 3, 6, 5) and out["img"].dtype == torch.float64
        assert out["pixels"].dtype == torch.uint8

    def test_unsqueeze_leaves_a_batch_of_images_as_it_is(self):
        """As TorchRL's: only a single [H, W, C] image gains a leading dim (a batch of [4]
        images came out [4, 1, 3, H, W])."""
        td = pixels_td((4, 6, 7, 3))
        out = ToTensorImage(unsqueeze=True)(td)["pixels"]
        assert out.shape == (4, 3, 6, 7)
        single = pixels_td((4, 6, 7, 3))[0]
        assert ToTensorImage(unsqueeze=True)(single)["pixels"].shape == (1, 3, 6, 7)

    def test_bad_images(self):
        with pytest.raises(ValueError, match="'obs'.*not an image"):
            ToTensorImage(in_keys=["obs"])(TensorDict({"obs": torch.zeros(4, 3)}, [4]))
        chw = TensorDict({"pixels": torch.zeros(2, 3, 16, 16, dtype=torch.uint8)}, [2])
        with pytest.raises(ValueError, match="'pixels'.*channels-last"):
            ToTensorImage()(chw)
        out = ToTensorImage(shape_tolerant=True)(chw)["pixels"]
        assert out.shape == (2, 3, 16, 16) and out.dtype == torch.float32
        with pytest.raises(KeyError, match="'pixels'"):
            ToTensorImage()(TensorDict({"obs": torch.zeros(2, 4, 4, 3)}, [2]))
        with pytest.raises(TypeError, match="bool"):
            ToTensorImage()(TensorDict({"pixels": torch.zeros(2, 4, 4, 3, dtype=torch.bool)}, [2]))
        with pytest.raises(ValueError, match="same length"):
            ToTensorImage(in_keys=["a", "b"], out_keys=["c"])


class TestResize:
    def test_shapes_with_leading_dims(self):
        td = TensorDict({"pixels": torch.rand(2, 5, 3, 20, 30)}, [2, 5])
        out = Resize(33, in_keys=["pixels"], out_keys=["pixels33"])(td)
        assert out["pixels33"].shape == (2, 5, 3, 33, 33)
        assert out["pixels"].shape == (2, 5, 3, 20, 30)
        assert Resize(8, 4)(td)["pixels"].shape == (2, 5, 3, 4, 8)

    @pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest", "nearest-exact", "area"])
    def test_constant_image_stays_constant(self, mode):
        img = torch.full((4, 3, 17, 23), 0.25)
        out = Resize(9, 11, interpolation=mode)(TensorDict({"pixels": img}, [4]))["pixels"]
        assert out.shape == (4, 3, 11, 9)
        assert torch.allclose(out, torch.full_like(out, 0.25), atol=1e-6)

    def test_same_size_is_identity_and_nearest_upsampling_repeats(self):
        img = torch.rand(2, 3, 6, 6)
        out = Resize(6)(TensorDict({"pixels": img.clone()}, [2]))["pixels"]
        assert torch.allclose(out, img, atol=1e-6)
        small = torch.arange(4.0).reshape(1, 1, 2, 2)
        up = Resize(4, interpolation="nearest")(TensorDict({"pixels": small}, [1]))["pixels"]
        assert up[0, 0].tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]]

    def test_area_downsampling_averages_blocks(self):
        img = torch.arange(16.0).reshape(1, 1, 4, 4)
        out = Resize(2, interpolation="area")(TensorDict({"pixels": img}, [1]))["pixels"]
        assert out[0, 0].tolist() == [[2.5, 4.5], [10.5, 12.5]]

    def test_uint8_stays_uint8(self):
        img = torch.full((2, 3, 8, 8), 200, dtype=torch.uint8)
        out = Resize(4)(TensorDict({"pixels": img}, [2]))["pixels"]
        assert out.dtype == torch.uint8 and out.eq(200).all()

    def test_interpolation_enum_like_and_repr(self):
        class Mode:  # stands in for torchvision's InterpolationMode
            value = "bilinear"
        t = Resize(32, interpolation=Mode(), in_keys=["pixels", ("next", "pixels")])
        assert repr(t) == ("Resize(w=32, h=32, interpolation=bilinear, keys=['pixels', "
                           "('next', 'pixels')])")

    def test_bad_input(self):
        with pytest.raises(ValueError, match="interpolation"):
            Resize(8, interpolation="lanczos")
        with pytest.raises(ValueError, match="positive"):
            Resize(0)
        hwc = TensorDict({"pixels": torch.rand(2, 16, 16, 3)}, [2])
        with pytest.raises(ValueError, match="'pixels'.*channels-last.*ToTensorImage"):
            Resize(8)(hwc)
        with pytest.raises(ValueError, match="'vec'.*not an image"):
            Resize(8, in_keys=["vec"])(TensorDict({"vec": torch.rand(2, 5)}, [2]))
        with pytest.raises(KeyError, match="'pixels'"):
            Resize(8)(TensorDict({"other": torch.rand(2, 3, 4, 4)}, [2]))


class TestGrayScale:
    def test_values(self):
        img = torch.zeros(2, 3, 2, 2)
        img[:, 0] = 1.0  # red
        img[1, 1] = 1.0  # second image yellow
        out = GrayScale()(TensorDict({"pixels": img}, [2]))["pixels"]
        assert out.shape == (2, 1, 2, 2)
        assert torch.allclose(out[0], torch.full((1, 2, 2), 0.2989))
        assert torch.allclose(out[1], torch.full((1, 2, 2), 0.2989 + 0.587))

    def test_uint8_and_single_channel(self):
        img = torch.full((3, 3, 4, 4), 100, dtype=torch.uint8)
        out = GrayScale()(TensorDict({"pixels": img}, [3]))["pixels"]
        assert out.dtype == torch.uint8 and out.eq(99).all()  # 99.99 truncated, as torchvision
        gray = torch.rand(3, 1, 4, 4)
        assert torch.equal(GrayScale()(TensorDict({"pixels": gray}, [3]))["pixels"], gray)

    def test_not_rgb(self):
        with pytest.raises(ValueError, match="'pixels'.*RGB"):
            GrayScale()(TensorDict({"pixels": torch.rand(2, 4, 8, 8)}, [2]))
        with pytest.raises(ValueError, match="not an image"):
            GrayScale()(TensorDict({"pixels": torch.rand(2, 3)}, [2]))


class TestCenterCrop:
    def test_values_and_shape(self):
        img = torch.arange(2 * 3 * 6 * 8.0).reshape(2, 1, 3, 6, 8)
        out = CenterCrop(4, 2)(TensorDict({"pixels": img}, [2, 1]))["pixels"]
        assert out.shape == (2, 1, 3, 2, 4)
        assert torch.equal(out, img[..., 2:4, 2:6])

    def test_odd_offsets_round_like_torchvision(self):
        img = torch.arange(25.0).reshape(1, 1, 5, 5)
        out = CenterCrop(2)(TensorDict({"pixels": img}, [1]))["pixels"]
        # round((5 - 2) / 2) = round(1.5) = 2
        assert torch.equal(out, img[..., 2:4, 2:4])

    def test_crop_larger_than_image_pads_with_zeros(self):
        img = torch.ones(1, 1, 2, 2)
        out = CenterCrop(4)(TensorDict({"pixels": img}, [1]))["pixels"]
        assert out.shape == (1, 1, 4, 4)
        assert out[0, 0].tolist() == [[0, 0, 0, 0], [0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]]

    def test_bad_input(self):
        with pytest.raises(ValueError, match="channels-last"):
            CenterCrop(4)(TensorDict({"pixels": torch.rand(2, 16, 16, 3)}, [2]))
        with pytest.raises(ValueError, match="positive"):
            CenterCrop(4, -1)
