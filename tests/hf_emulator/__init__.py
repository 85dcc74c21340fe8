"""A local emulation of HF Jobs and the HF sandbox server, for running the real huggingface_hub SDK against docker.

`jobs` is the job lifecycle (a job is a docker container), `api` the Hub/Jobs HTTP routes over it, `run` starts it,
`fixture` is the pytest fixture; `sandbox_server` is the server each sandbox job runs in place of the downloaded
binary. See README.md.
"""
