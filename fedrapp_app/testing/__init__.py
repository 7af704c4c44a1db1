"""Support for the tests and benchmarks, not part of the product: nothing else in ``fedrapp_app`` imports it
(``tests/test_layering.py`` checks that).

- :mod:`fedrapp_app.testing.cuda_emulation`: CUDA's autocast op lists and device placement, emulated on the CPU, so
  that the fp16 and host-device-sync paths are tested without a GPU.
"""
