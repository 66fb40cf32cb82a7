"""<Method name>: <equation on one line>.

<Paper citation and link>. Pure: no I/O, no printing.
"""

from __future__ import annotations
