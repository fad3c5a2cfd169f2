import sys
from pathlib import Path

# Make tests/timelines.py importable as `timelines` whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))
