# Stands in for Hugging Face transformers in llama.cpp's converter: the config falls back to
# config.json (the converter's own fallback) and no tokenizer is read.
class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers shim: read config.json")
class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers shim: no tokenizer")
