# Sourced by gpu_check.sh and campaign.sh from the repository root: on a bare GPU image (Python and torch, nothing
# else, no package index) set up offline from the carried bundle (`make gpu-bundle` here; BUNDLE=dir to name
# another) over the image's python3 and its torch, then activate the venv. $1: the variable that gets the set-up's
# seconds (the report records them).
VENV=${VENV:-.venv}
if [ -n "${BUNDLE:-}" ] || { [ ! -f "$VENV/.setup-stamp" ] && [ -f .gpu_bundle/MANIFEST ]; }; then
  started=$SECONDS
  PYTHON=${PYTHON:-python3} VENV=$VENV BUNDLE=${BUNDLE:-.gpu_bundle} bash scripts/setup_env.sh
  export "$1=$((SECONDS - started))"
  echo "set-up from the bundle: $((SECONDS - started)) s" >&2
fi
[ -f "$VENV/bin/activate" ] && source "$VENV/bin/activate"
