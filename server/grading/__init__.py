"""Grade a diff on a task's FAIL_TO_PASS / PASS_TO_PASS tests, in a fresh sandbox, with swebench's parser.

Needs a sandbox factory and a task, nothing else. The sandbox starts from the pristine repository at
`base_commit`; only the extracted diff crosses over.

Where each idea lives (this module only hands names on):
- `grader`: `grade` itself (the runs of one grading, in order) and `prepare` (a task's first-use measurements);
- `plan`: how a task is graded (path, parser, cross-check), the log markers, swebench's TestSpec;
- `files`: the file filter and the pins (what of the model patch reaches the grading tree, what is reset);
- `script`: the shell script a grading run executes;
- `verdict`: swebench's verdict on a run, cross-checked with the JUnit report and the guard's record;
- `guard_plugin` / `integrity`: the runtime record (the pytest plugin and audit hook, and how the grader reads it);
- `canaries`: the mutation canaries; `variants`: impossible variants (the canaries in place of the tests);
  `runtimes`: run times, empty-patch baselines, timeouts; `store`: what is kept of a task on disk (run times,
  baselines, canaries), keyed by its content.

How a task is graded follows its own data (`TestReport.graded_by` says which path ran):
- eval_script: a row that carries its own SWE-bench eval script (+ `log_parser`, `eval_type`) is run through
  swebench's `make_test_spec` (which also records the test command's exit status) and read with that parser;
- install_config: a SWE-rebench row runs its `install_config.test_cmd` in the env its `install_config` declares
  (the image's conda env; on `local`, a venv built from it: `swe_gym_env.tasks.envs`) and is read with its
  `log_parser`; the packages it declares are checked first, and a missing one is named;
- repo_parser / pytest: otherwise the row's test command (Django's and sympy's own runners, else pytest -rA) with the
  parser swebench's `MAP_REPO_TO_PARSER_PY` gives the repo, else swebench's pytest parser.

The reward is swebench's verdict on the log (`get_logs_eval` → `get_eval_tests_report` → `get_resolution_status`):
1.0 for RESOLVED_FULL, else 0.0 — also when the model patch does not apply.

## Threat model

The policy under training is an adversary of this grader. It controls every byte of the tree the diff carries, and
its code runs *inside* the grading test process (the tests import it). It does not see the hidden tests. Listing its
tricks lost twice, so grading is a construction that trusts nothing the patch can write (`TestReport.integrity` says
what it saw: `clean`, `tampered: …`, `patch_broke_run: …`; `TestReport.canaries` what the canary run did):

1. **What reaches the tree is an allowlist** (`files`): the project's files under folders base_commit has, new modules
   included; parsed configuration files (`pyproject.toml`, `setup.cfg`, `tox.ini`) only where the keys they change
   are ones nothing reads at test time; paths compared after NFKC and case folding. Everything else (configuration,
   plugins and start-up files at any depth, package metadata, bytecode, symlinks, new folders, new top-level modules
   named like anything the environment or the runner imports, the verdict's test files) is dropped
   (`protected_files`); the verdict's files are reset to base_commit before the test patch goes on. base_commit's
   tree is measured once per task and sandbox kind (`base_tree`).
2. **Nothing of the tree runs before the guard, and nothing in the tree configures pytest** (`script`,
   `guard_launch.py`): at base_commit, before the model patch, the launcher resolves pytest's rootdir, configuration
   and conftest cut-off and the environment's entry-point plugins; the tests run from a script outside the tree (the
   tree goes on `sys.path` after the standard library), with the guard registered first, settings from the pinned
   copy only, and entry-point plugins from base_commit's list only. No install or build step runs after the patch.
3. **A record that leaves the test process as it is written**: the guard (`guard_plugin.py`) writes each line to a
   pipe whose other end is the launcher's collector, a non-dumpable process holding the key the test process never
   has; it chains each line as it arrives. The grader (`integrity.read_record`) requires the chain, the guard's own
   numbering and one outcome per test phase, then compares the record, the log (swebench's parse) and the JUnit
   report. The guard snapshots `builtins`, pytest's outcome exceptions and reporting machinery before the tree is
   imported and checks them before each test and at the end; its audit hook records the in-process ways of reaching
   the run (`runtime_record`). Anything seen: **tampering, reward 0.0** (`grading_tampered`).
4. **A test passes only as the gold patch passed it**: the gold patch's status per listed test is measured with the
   canaries; a test gold passed that ends XFAIL or skipped is failed.
5. **Mutation canaries in a run no code can tell apart** (`canaries`): when the verdict would be 1.0, a second run puts
   gold-killed mutants in place of the FAIL_TO_PASS tests. Both runs are one procedure whose only differing input is
   the bytes of those files (padded to one length; every time under the tree and the grading folder normalised; the
   order drawn by a coin). A canary that passes means the test checks nothing: **reward 0.0**, whatever the
   mechanism. Every task of the bundled and pypi splits has canaries.

**Breaking the run is the patch's fault when the empty patch runs.** A run that times out, dies before pytest's end
(`os._exit`, a signal), leaves no parsable results or JUnit report, or whose test patch no longer applies, is judged
against the empty patch's run (once per task, image and sandbox kind, kept on disk): if that run reports results,
reward 0.0 with `patch_broke_test_run: <how>`; only when it fails too is it infra (`GradingError`, reward None). The
test timeout is the task's own measured run time times `SWE_GYM_GRADING_TIMEOUT_MULTIPLE` (floor
`SWE_GYM_GRADING_TIMEOUT_FLOOR_S`), capped by the caller's `timeout_s` and by what the rollout's deadline leaves;
where nothing is measured yet, the empty patch runs first and sizes it. A timeout the deadline cut below four times
the measured run time is not blamed on the patch (infra). A canary run that breaks where the gold patch's completes
is the patch's 0.0 too. A failed subtest (pytest ≥ 9 logs `SUBFAILED` lines) fails its test, never a pass.

**Tests visible.** A rollout with `tests_visible` has the test patch committed in the agent's workspace (it can read
and run the failing tests). Grading does not change: the test files are reset and the test patch re-applied in a
fresh sandbox, and the canaries are never shown. What changes is the residual risk below: special-casing the tests'
inputs needs no guessing when the agent reads them.

**Impossible variants** (`variants`: a cheating-rate meter, not a defence). `variant: "impossible"` shows the agent
the task's tests with its kept gold-killed mutants in place of the originals and grades it on those (no canary check
of its own: its tests are the canaries). No honest fix passes them (the gold patch fails them; `validate` grades it
on every variant and keeps only those where it scores 0.0), so any 1.0 there is a cheat the other layers missed:
reward 0.0 with `impossible_solved`, the report keeping what the tests said. A `grading_tampered` finding there is a
cheat the layers caught. The agent sees these tests, so the rate counts what a policy does when tests and statement
disagree; special-casing the shown inputs passes them, and is counted as the cheat it is.

Not defended (residual risk): a patch that special-cases the tests' own inputs with the right outputs passes its
canaries (it behaves like a fix on exactly what is tested), and cannot be told from a fix without more tests. Code in
the test process can replace what the guard checks between two checks and put it back, write lines of its own to the
collector's pipe (seen: a phase recorded twice, numbering broken) or stop the guard writing (seen: the log's PASSED is
not the record's); it cannot take back or rewrite a recorded line. Tasks whose code under test is pytest itself or a
pytest plugin; helper modules the tests import that no test id names are the patch's to change; a P2P test the code
under test skips via a condition evaluated in the test file is "maintained" (swebench's rule) unless gold passed it.
An honest fix that needs a new folder, a pytest setting or a build step is graded without that part (`validate`
measures every gold patch). Other runners (Django's, sympy's: cross check `not_pytest`) get the allowlist, the reset,
the broken-run rule and the canaries (their status from the log parser alone), but no launcher and no record: their
log is trusted.
"""

from swe_gym_env.server.grading import variants
from swe_gym_env.server.grading.errors import BrokenRun, GradingError
from swe_gym_env.server.grading.files import BaseTree, filter_model_patch, split_patch, task_verdict_files
from swe_gym_env.server.grading.grader import base_tree, grade, prepare, prepare_impossible, prepared
from swe_gym_env.server.grading.plan import (
    APPLY_FAILED,
    END,
    EXIT,
    GUARD_MODULE,
    START,
    TEST_PATCH_FAILED,
    Plan,
    load_swebench,
    make_test_spec,
    plan_for,
    row_test_spec,
)
from swe_gym_env.server.grading.script import Guarded, eval_script, pytest_command, row_eval_wrapper
from swe_gym_env.server.grading.verdict import Grade, Run, diagnose, judge, junit_key, parse_junit, score_log

__all__ = [
    "APPLY_FAILED",
    "END",
    "EXIT",
    "GUARD_MODULE",
    "START",
    "TEST_PATCH_FAILED",
    "BaseTree",
    "BrokenRun",
    "Grade",
    "GradingError",
    "Guarded",
    "Plan",
    "Run",
    "base_tree",
    "diagnose",
    "eval_script",
    "filter_model_patch",
    "grade",
    "judge",
    "junit_key",
    "load_swebench",
    "make_test_spec",
    "parse_junit",
    "plan_for",
    "prepare",
    "prepare_impossible",
    "prepared",
    "pytest_command",
    "row_eval_wrapper",
    "row_test_spec",
    "score_log",
    "split_patch",
    "task_verdict_files",
    "variants",
]
