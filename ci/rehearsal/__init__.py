"""The nightly's dress rehearsal on CPU (ci/rehearse.py): GitHub Actions workflows read and executed job by job in
their own order, with their own `needs` / `if` logic, each `run:` step as written, on local stand-ins for GitHub's
services (checkout, setup-python, artifacts, releases) and for the Ascend runners (a clean "image" Python with the
emulated torch_npu and its emulated HCCL group, no package index inside the container)."""
