# Sourced by kiln's scripts: finds nvcc where the CUDA toolkit installs it,
# so KILN_CUDA turns itself on when CUDA is present.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(nproc 2>/dev/null || echo 2)
