"""Turning an LLM's free-text answer into a clean list of queries."""
import json
import re
from typing import List, Optional

_LIST_MARKER = re.compile(r'^\s*(?:[-*•]+|\(?\d+[.):]|\(?[a-zA-Z][.)]|Q\d*[.):]|Q\d+'
                          r'|(?:Query|Question)\s*\d*\s*[.):])\s*', re.IGNORECASE)
_PREAMBLE = re.compile(r'^(here (are|is)|sure|certainly|of course|the following'
                       r'|(queries|questions?|query|keywords?|output):?$)', re.IGNORECASE)
_ANSWER = re.compile(r'^\s*(?:A\d*|Answer\s*\d*)\s*[.):]', re.IGNORECASE)


def parse_queries(text: str, limit: Optional[int] = None) -> List[str]:
    """Extracts queries from generated text: a JSON list if there is one, else list items, else lines.

    Numbering and bullets (``1.``, ``2)``, ``-``, ``Q1:``, ``Q:``) and surrounding quotes are removed; when some lines
    are list items, the other lines (preambles, sign-offs) are dropped; so are answer lines (``A:``), empty items and
    duplicates (ignoring case).

    Args:
        text: The generated text.
        limit: Keep at most this many queries.

    Returns:
        The queries, in the order generated.
    """
    items = _json_list(text)
    if items is None:
        lines = [line.strip() for line in text.splitlines()]
        # preambles, and the answers small models write after their questions, are not queries
        lines = [line for line in lines if line and not _PREAMBLE.match(line) and not _ANSWER.match(line)]
        listed = [line for line in lines if _LIST_MARKER.match(line)]
        # when the answer is a list, the lines around it (preamble, sign-off) are not queries
        items = [_LIST_MARKER.sub('', line, count=1) for line in (listed or lines)]
    queries, seen = [], set()
    for item in items:
        query = item.strip().strip('"\'`“”').strip()
        if query and query.lower() not in seen:
            seen.add(query.lower())
            queries.append(query)
    return queries[:limit]


def _json_list(text: str) -> Optional[List[str]]:
    start, end = text.find('['), text.rfind(']')
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and value and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    return None
