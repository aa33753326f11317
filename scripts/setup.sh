#!/usr/bin/env bash
# Installs every Debian package that building, testing and the demo need. Idempotent: runs
# `apt-get update` and `apt-get install` only when a package is missing. Run as root (or with sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libdnnl-dev                      # matmul (f32, bf16, int8)
  ocl-icd-opencl-dev               # Debian's oneDNN CMake config requires OpenCL (only a Recommends)
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libstb-dev zlib1g-dev libpcre2-dev
  libedit-dev                      # line editing and history in `hyla chat` (BSD-licensed)
  libopenmpi-dev openmpi-bin       # multi-process runs
  clang libclang-rt-14-dev         # libFuzzer target (scripts/fuzz.sh)
  bible-kjv dataset-fashion-mnist  # demo corpora
  dict-devil                       # the long-context suite's held-out haystack
  fonts-dejavu-core                # the fonts `hyla data prepare-documents` draws with
  curl                             # end-to-end server tests
  chromium                         # the chat page's test in a headless browser
  util-linux                       # flock around the tests' one npm install
  procps                           # pkill in the kill -9 resume test
  jq                               # scripts/studies.sh summaries
)
# Node.js and npm run the `openai` and `@anthropic-ai/sdk` clients and puppeteer-core in the server tests. Machines that already have them
# (e.g. from NodeSource, whose nodejs package conflicts with Debian's npm) keep theirs.
if ! command -v npm >/dev/null 2>&1; then packages+=(nodejs npm); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
