"""One module per harness: how its CLI is installed, configured against the capture relay, run one-shot and its own
log read back. Adding a harness is one module here plus one row in `swe_gym_env.core.names.HARNESSES`."""
