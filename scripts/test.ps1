# The README's test command on Windows (PowerShell): powershell -ExecutionPolicy Bypass -File scripts\test.ps1
# Lint, type-check and run the test suite in .venv (created with Python 3.11+ if missing: setup_env.ps1).
# Arguments go to pytest. Not run on Windows by this project's CI (which is Linux): the shared-memory tests
# there need the Windows transport paths that are only unit-tested on Linux (docs/unreal-install.md);
# tests/test_powershell_scripts.py parses this script.
$ErrorActionPreference = "Stop"
$Arguments = $args  # taken before dot-sourcing, which runs another script in this scope
$Extras = "dev,plots"
. (Join-Path $PSScriptRoot "setup_env.ps1")
& $Python -m ruff check .
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
& $Python -m mypy protocol trainer emulator benchmarks scripts
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
& $Python -m pytest @Arguments
exit $LASTEXITCODE
