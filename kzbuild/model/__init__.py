"""kzbuild's typed core model: frozen dataclasses, one module per concept.

The model never prints and never runs processes; loaders in the capability modules build it
from validated files.
"""
