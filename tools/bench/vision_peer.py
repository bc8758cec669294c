#!/usr/bin/env python3
"""Peer numbers for bench/vision_bench.cc: images/s of transformers' Qwen2-VL image processor
(torchvision backend, the default, and the PIL backend) on the same photos, decoded once up
front, one thread, same max_pixels values. Run from the repository root."""
import os
import time
import warnings

import numpy as np
import torch
from PIL import Image

import transformers
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

PHOTOS = ["photo_chelsea.jpg", "photo_coffee_444.jpg", "photo_rocket_422.jpg", "photo_odd_301x201.png",
          "photo_progressive.jpg"]


def main():
    images = [np.array(Image.open(os.path.join("tests/data/vision/images", p)).convert("RGB")) for p in PHOTOS]
    for name, cls in [("torchvision", Qwen2VLImageProcessor), ("pil", Qwen2VLImageProcessorPil)]:
        for max_pixels in [28 * 28 * 64, 28 * 28 * 1280]:
            proc = cls(min_pixels=3136, max_pixels=max_pixels)
            for img in images:  # warm-up
                proc(images=[img], input_data_format="channels_last", return_tensors="pt")
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 2.0:
                proc(images=[images[n % len(images)]], input_data_format="channels_last", return_tensors="pt")
                n += 1
            dt = time.perf_counter() - t0
            print(f"HF Qwen2VLImageProcessor[{name}] max_pixels={max_pixels}: {n / dt:.1f} images/s "
                  f"({dt / n * 1e6:.0f} us/image)")


if __name__ == "__main__":
    main()
