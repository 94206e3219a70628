"""Images sent by clients: decoded safely, then made into the pixels a model's image processor makes.

- ``decode``: a ``data:image/...;base64,`` URI to bytes, the bytes' format and size read from their header
  alone (``header_size``), and the bytes decoded into a Pillow image (``open_image``) under ``ImageLimits``;
  anything wrong with an image is an ``ImageError``, whose message the HTTP client reads (a 4xx).
- ``preprocess``: ``ImageProcessing``, a folder's preprocessor_config.json (CLIP's or SigLIP's processor)
  applied exactly as transformers' PIL backend applies it: RGB conversion, resize and center crop on uint8
  (``pixels``), then rescale and normalise in its float32 arithmetic (``normalize``, or on the worker's
  device from ``scale``, ``mean`` and ``std``).
- ``pages``: ``PageProcessing``, a page model's (ColQwen2's) Qwen2-VL image processor: resized to whole
  merge windows within its pixel bounds (``target_size``), cut into uint8 patch rows in the processor's
  order (``prepare``), rescaled and normalised with the temporal copy as its ``pixel_values`` rows are.

Who imports it: the gateway checks a data URI, the header's format and size against ``ImageLimits``
before it publishes a request (``decode``'s URI and header functions need no Pillow); the tokenizer fleet
decodes and prepares the uint8 pixels (``open_image``, ``ImageProcessing.pixels``, ``PageProcessing.prepare``);
the GPU worker reads their rescale and normalisation to finish the pixels on its device. Nothing here imports
transformers or torch.
"""
