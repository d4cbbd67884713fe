"""Imports whale_lab to print the val answers.

Expect: error ModuleNotFoundError
"""

import whale_lab.domains.math_problems as mp

print(mp)
