# The README's test command on Windows (PowerShell): powershell -ExecutionPolicy Bypass -File scripts\test.ps1
# Lint, type-check and run the test suite in .venv (created with Python 3.11+ if missing). Arguments go to
# pytest. Not run on Windows by this project's CI (which is Linux): the shared-memory tests there need
# the Windows transport paths that are only unit-tested on Linux (docs/unreal-install.md).
$ErrorActionPreference = "Stop"
$Root = Split-Path -Parent $PSScriptRoot
$Venv = if ($env:LA_TRAINER_VENV) { $env:LA_TRAINER_VENV } else { Join-Path $Root ".venv" }
$Python = Join-Path $Venv "Scripts\python.exe"
if ((Test-Path $Venv) -and -not (Test-Path $Python)) {
    Write-Host "The virtual environment in $Venv is broken; making it again."
    Remove-Item -Recurse -Force $Venv
}
if (-not (Test-Path $Python)) {
    py -3.11 -m venv $Venv
    if ($LASTEXITCODE -ne 0) { throw "Could not create $Venv: install Python 3.11 from python.org (with the py launcher)." }
}
& $Python -m pip install --quiet --disable-pip-version-check -c (Join-Path $Root "constraints.txt") -e "$Root[dev,plots]"
if ($LASTEXITCODE -ne 0) { throw "pip install failed" }
Set-Location $Root
& $Python -m ruff check .
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
& $Python -m mypy protocol trainer emulator benchmarks scripts
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
& $Python -m pytest @args
exit $LASTEXITCODE
