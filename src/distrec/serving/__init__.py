"""Serving: a trained model leaves distrec.

- scoring a data file with a checkpoint or an exported program, streamed -> ``predict``;
  the file of scores it writes -> ``scores_file``
- the whole model as one ``torch.export`` program or ONNX model -> ``export``, made by
  ``program`` (jagged inputs in, click probabilities out) in the input signature of
  ``inputs``; the JSON beside it (features, transforms, raw value -> table row) -> ``manifest``;
  the ONNX form -> ``onnx_format``
- the pooled lookup in plain torch operators, which ``torch.export`` can trace -> ``lookup``;
  tables stored as float16 or 8-bit row-wise (FBGEMM's fused layout) -> ``quantize``; the
  choices an export offers -> ``formats``
"""
