"""The dashboard's pages, one module each, in navigation order."""

from dashboard.pages import communication, compare, findings, lookup, memory, overview, timeline

PAGES = [overview, timeline, findings, lookup, memory, communication, compare]
