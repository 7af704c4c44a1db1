"""Support for the tests and benchmarks, not part of the product: nothing else in ``fedrapp_app`` imports it
(``tests/test_layering.py`` checks that).

- :mod:`fedrapp_app.testing.cuda_emulation`: CUDA's autocast op lists and device placement, emulated on the CPU, so
  that the fp16 and host-device-sync paths are tested without a GPU.
- :mod:`fedrapp_app.testing.kernels`: the float-kernel profiles of older x86 CPUs (AVX2, pre-AVX), emulated on
  this one, under which CI runs the golden tests (``-m kernels``) a second time.
"""
