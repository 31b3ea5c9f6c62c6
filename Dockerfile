# CPU image: `runtime serve` on a bundle mounted read-only at /bundle (the numpy reference backend).
#   docker build -t toolcall-engine:cpu .
#   docker run --rm -p 8000:8000 -v "$PWD/artifacts/toolcall-cpu:/bundle:ro" toolcall-engine:cpu
# python:3.11-slim: the smallest official base with the CPython the project needs (>= 3.11) and
# glibc for the manylinux wheels (numpy with its OpenBLAS, tokenizers, safetensors); nothing compiles.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp

WORKDIR /opt/toolcall-engine
COPY pyproject.toml ./
COPY common ./common
COPY kernels ./kernels
COPY runtime ./runtime
COPY builder ./builder
COPY schemas ./schemas
COPY models ./models
# A wheel install (not editable): the source tree is not needed at run time.
RUN pip install ".[serve]" && cd / && rm -rf /opt/toolcall-engine

# Any non-root uid works (the manifests set runAsNonRoot); the bundle only has to be readable.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["runtime"]
CMD ["serve", "/bundle", "--host", "0.0.0.0", "--port", "8000"]
