"""`python -m ddpjob_operator`: the operator process (controller/main.py)."""
import sys

from ddpjob_operator.controller.main import main

sys.exit(main())
