"""`ssmcheck scan`: its stages, one module each (see ARCHITECTURE.md).

The package is callable: `ssmcheck.scan(kernel=..., preset=..., **options)` runs the command
through the Python API (ssmcheck.api.scan) and returns its Report.
"""

import sys

from ssmcheck.api import CommandPackage

sys.modules[__name__].__class__ = CommandPackage
