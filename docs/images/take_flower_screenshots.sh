#!/usr/bin/env bash
# Takes the three Flower screenshots of docs/operations.md ("Flower") with headless Chromium.
#
# Usage:
#   take_flower_screenshots.sh FLOWER_URL FAILED_TASK_ID REVERSAL_TASK_ID EXECUTION_ID [OUT_DIR]
#
#   FLOWER_URL        where Flower answers, e.g. http://127.0.0.1:5555
#   FAILED_TASK_ID    task id of the failed step (ship_order of the example's order B2)
#   REVERSAL_TASK_ID  task id of one of its reversals (release_item of the same run)
#   EXECUTION_ID      the run's execution id (its tasks are listed by searching it)
#   OUT_DIR           where the PNGs go (default: this script's folder)
#
# Run the example project on a real broker with `celery worker`, beat and Flower first (see
# docs/operations.md); `celery -A example_project.app saga list` gives the execution id and
# Flower's task list (or /api/tasks) the task ids. CHROMIUM overrides the browser command.
# The task pages are cut above the traceback. Flower fills the search box from `?name=`
# only as `name:...`, so the search page asks for `name:ID OR ID`: it matches what a search
# for ID alone matches (no task name holds an execution id).
set -euo pipefail

if [ $# -lt 4 ]; then
    sed -n '4,11p' "$0" >&2
    exit 2
fi
flower=${1%/}
out=${5:-$(dirname "$0")}
chromium=${CHROMIUM:-chromium}

shot() {  # shot FILE WIDTH HEIGHT URL
    "$chromium" --headless=new --no-sandbox --disable-gpu --hide-scrollbars \
        --window-size="$2,$3" --virtual-time-budget=8000 --screenshot="$out/$1" "$4" \
        2>/dev/null
    echo "$out/$1"
}

shot flower-failed-step.png 1200 954 "$flower/task/$2"
shot flower-reversal.png 1200 1250 "$flower/task/$3"
shot flower-search.png 1400 880 "$flower/tasks?name=$4%20OR%20$4"
