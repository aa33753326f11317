#!/usr/bin/env bash
# Goldens for Kimi's pre-tokenizer on 1 MiB texts (issue 65), from llama.cpp's own Kimi tokenizer:
# writes tests/data/kimi-pretokenizer/ (a small tiktoken vocabulary whose tokens span the places a
# wrong split would cut, and cases.json), which Tiktoken.KimiPreTokenizerMatchesLlamaCppOnMegabyteRuns
# checks hyla against.
#
#   bash scripts/kimi-pretokenizer-goldens.sh BUILD LLAMA_CPP
#
# BUILD holds hyla; LLAMA_CPP a llama.cpp tree with build/bin/llama-tokenize (scripts/check-llamacpp.sh
# says how to build one). Each case's text is PIECES drawn by a 64-bit LCG from SEED until it holds
# at least BYTES bytes (the test draws the same); cases.json keeps the text's and the ids' FNV-1a
# hashes, their counts and the first ids. hyla's ids must equal llama.cpp's, or nothing is written.
#
# Where both work, llama.cpp's splitter (unicode.cpp, unicode_regex_split_custom_kimi_k2) and the
# reference regex (tokenization_kimi.py, which hyla runs as PCRE2) agree. They part where a letter
# run changes case downwards-to-upwards ("CamelCase": the regex cuts "Camel|Case", llama.cpp keeps
# one run) or holds combining marks (\p{M} are letters to the regex only); the cases avoid those
# junctions, and hyla follows the regex there (Tiktoken.KimiPatternSplitsAsTokenizationKimi).
set -euo pipefail
build=$(cd "$1" && pwd) llama=$(cd "$2" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$repo/tests/data/kimi-pretokenizer"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/vocab"

python3 - "$work" <<'EOF'
import base64, json, struct, sys
work = sys.argv[1]
# Tokens spanning runs of one case, digit groups, whitespace mixes and several scripts; each added
# with every byte prefix of it, so that tiktoken's merging reaches it.
targets = ["xx", "xxxx", "xxxxxxxx", " x", " xx", "AC", "GT", "ACGT", "ACGTACGT", "12", "123", "00", "000",
           "  ", "   ", "    ", "\n\n", "\r\n", " \n", "\t\t", "世界", "日本", "日本語", " Привет", "Привет", " мир",
           "привет", " αβγ", "αβγ", "ΑΒΓ", " مرحبا", "مرحبا", " ひらがな", "ひらがな", " 🚀", " hello", "hello",
           " don", "'t", " don't", " Hello", ", ", ".\n", "!?", " (", "x)", " ACGT", "мирпривет", "helloмир"]
tokens = [bytes([b]) for b in range(256)]
seen = set(tokens)
for t in sorted((s.encode() for s in targets), key=len):
    for n in range(2, len(t) + 1):
        if t[:n] not in seen:
            seen.add(t[:n]); tokens.append(t[:n])
with open(f"{work}/vocab/tiktoken.model", "w") as f:
    for rank, t in enumerate(tokens):
        f.write(f"{base64.b64encode(t).decode()} {rank}\n")
json.dump({"added_tokens_decoder": {}}, open(f"{work}/vocab/tokenizer_config.json", "w"))
json.dump({"vocab_size": len(tokens) + 256}, open(f"{work}/vocab_size.json", "w"))

lower = ["hello", "привет", "мир", "αβγ", "مرحبا", "ひらがな", "x"]
cases = [
    {"name": "one lowercase letter", "pieces": ["x"]},
    {"name": "uppercase DNA", "pieces": ["A", "C", "G", "T"]},
    {"name": "digits", "pieces": list("0123456789")},
    {"name": "whitespace", "pieces": [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ", "    ", "x"]},
    {"name": "lowercase and caseless letters of five scripts, unspaced", "pieces": lower},
    {"name": "mixed scripts, words, digits and punctuation",
     "pieces": [" hello", " don't", " ACGT", "世界", "日本語", " Привет", " мир", " مرحبا", " αβγ", " ΑΒΓ", " 🚀", "123",
                " 4567", ", ", ".\n", "\n\n", "  ", "!?", " (x)", " ひらがな", " Hello", "\t"]},
]
for seed, c in enumerate(cases, 1):
    c["seed"], c["bytes"] = seed, 1 << 20
    state, parts, size = seed, [], 0
    while size < c["bytes"]:
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        piece = c["pieces"][(state >> 33) % len(c["pieces"])].encode()
        parts.append(piece); size += len(piece)
    open(f"{work}/case{seed}.txt", "wb").write(b"".join(parts))
json.dump(cases, open(f"{work}/cases.json", "w"))
EOF

vocab_size=$(python3 -c "import json; print(json.load(open('$work/vocab_size.json'))['vocab_size'])")
python3 -c "import json; c=json.load(open('$repo/configs/kimi-k3-tiny.json')); c['vocab_size']=$vocab_size
json.dump(c, open('$work/config.json', 'w'))"
"$build/hyla" init --config "$work/config.json" --tokenizer "$work/vocab" --out "$work/vocab.gguf" --type f32 >/dev/null

python3 - "$work" "$build/hyla" "$llama/build/bin/llama-tokenize" <<'EOF'
import json, struct, subprocess, sys
work, hyla, tokenize = sys.argv[1:]
def fnv(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) % 2**64
    return f"{h:016x}"
cases = json.load(open(f"{work}/cases.json"))
failed = False
for i, c in enumerate(cases, 1):
    text_path = f"{work}/case{i}.txt"
    text = open(text_path, "rb").read()
    subprocess.run([hyla, "tokenizer", "encode", "--tokenizer", f"{work}/vocab", "--input", text_path,
                    "--out", f"{work}/hyla{i}.json"], check=True, stdout=subprocess.DEVNULL)
    hyla_ids = json.load(open(f"{work}/hyla{i}.json"))
    line = subprocess.run([tokenize, "-m", f"{work}/vocab.gguf", "-f", text_path, "--ids", "--no-bos", "--log-disable"],
                          check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    llama_ids = json.loads(line)
    if hyla_ids != llama_ids:
        at = next((k for k, (a, b) in enumerate(zip(hyla_ids, llama_ids)) if a != b), min(len(hyla_ids), len(llama_ids)))
        print(f"FAIL  {c['name']}: hyla {len(hyla_ids)} ids, llama.cpp {len(llama_ids)}; first difference at id {at}: "
              f"hyla {hyla_ids[at:at + 8]}, llama.cpp {llama_ids[at:at + 8]}")
        failed = True
        continue
    print(f"ok    {c['name']}: {len(text)} bytes -> the same {len(hyla_ids)} ids")
    c.update(text_fnv1a=fnv(text), ids=len(hyla_ids), ids_fnv1a=fnv(b"".join(struct.pack("<i", t) for t in hyla_ids)),
             first_ids=hyla_ids[:16])
if failed:
    sys.exit(1)
json.dump(cases, open(f"{work}/cases.json", "w"), indent=1, ensure_ascii=False)
EOF
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cp "$work/vocab/tiktoken.model" "$work/vocab/tokenizer_config.json" "$work/cases.json" "$out.tmp/"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "wrote $out"
