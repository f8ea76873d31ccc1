"""The images: variants (pins, tags, labels, auto), build (lock, wheelhouse, BuildSteps), setup."""
