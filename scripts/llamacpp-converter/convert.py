# llama.cpp's convert_hf_to_gguf.py (transformers/ here stands in for Hugging Face's) with set_vocab
# writing no vocabulary (tokenizer model "none", which llama.cpp loads as vocab_size dummy tokens):
# the tensor mapping is untouched. Debian 12's
# torch (1.13) lacks the newer dtypes the converter lists in a table; placeholders fill the table
# (no tensor of those types is read here).
#   PYTHONPATH=scripts/llamacpp-converter python3 scripts/llamacpp-converter/convert.py LLAMA_CPP ARGS...
import runpy, sys
import torch
for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, type(name, (), {})())
llama = sys.argv.pop(1)
sys.path[:0] = [llama, llama + "/gguf-py"]
import conversion.base
def no_vocab(self):
    self.gguf_writer.add_tokenizer_model("none")
conversion.base.TextModel.set_vocab = no_vocab
import conversion.kimi_linear, conversion.kimi_k3, conversion.bailingmoe3
conversion.kimi_linear.KimiLinearModel.set_vocab = no_vocab
conversion.kimi_k3.KimiK3Model.set_vocab = no_vocab
conversion.bailingmoe3.BailingMoeV3Model.set_vocab = no_vocab
sys.argv[0] = llama + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
