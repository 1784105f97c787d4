"""Turning an LLM's free-text answer into a clean list of queries."""
import json
import re
from typing import List, Optional

#: A list item's marker, followed by a space: ``1.``, ``2)``, ``a.``, ``-``, ``Q1:``, ``Query 2:`` (not the ``U.`` of
#: ``U.S.`` or the ``3.`` of ``3.5``).
_LIST_MARKER = re.compile(r'^\s*(?:[-*•]+|\(?\d+[.):]|\(?[a-zA-Z][.)]|Q\d*[.):]|Q\d+'
                          r'|(?:Query|Question)\s*\d*\s*[.):])(?:\s+|$)', re.IGNORECASE)
#: Lines that introduce or close an answer: whole words (``surety bond`` is a query), or a line ending in a colon.
_PREAMBLE = re.compile(r'^(?:(?:here(?:\'s| are| is)|sure|certainly|of course|the following)\b'
                       r'|(?:i )?hope (?:this|these|that) helps?\b|.*:$)', re.IGNORECASE)
#: The answers small models write after their questions: ``A:``, ``A1:``, ``Answer:`` (``A.`` opens a lettered list).
_ANSWER = re.compile(r'^\s*(?:A\d*\s*:|Answer\s*\d*\s*[.):])', re.IGNORECASE)
#: Markdown emphasis around a whole line or item.
_EMPHASIS = re.compile(r'^(\*\*|__)(.*)\1$')


def parse_queries(text: str, limit: Optional[int] = None) -> List[str]:
    """Extracts queries from generated text: a JSON list if there is one, else list items, else lines.

    Numbering and bullets (``1.``, ``2)``, ``a.``, ``-``, ``Q1:``, ``Q:``, each followed by a space), markdown
    emphasis and surrounding quotes are removed; when some lines are list items, the other lines are dropped;
    preambles and sign-offs (``Here are ...``, a line ending in a colon, ``Hope this helps``) are dropped anyway, and
    so are answer lines (``A:``), empty items and duplicates (ignoring case). A JSON list of strings is taken whole.

    Args:
        text: The generated text.
        limit: Keep at most this many queries.

    Returns:
        The queries, in the order generated.
    """
    if limit is not None and limit < 0:
        raise ValueError(f'limit must be None or at least 0, got {limit}')
    items = _json_list(text)
    if items is None:
        lines = [_EMPHASIS.sub(r'\2', line.strip()).strip() for line in text.splitlines()]
        # preambles, and the answers small models write after their questions, are not queries
        lines = [line for line in lines if line and not _PREAMBLE.match(line) and not _ANSWER.match(line)]
        listed = [line for line in lines if _LIST_MARKER.match(line)]
        # when the answer is a list, the lines around it (preamble, sign-off) are not queries
        items = [_LIST_MARKER.sub('', line, count=1) for line in (listed or lines)]
    queries, seen = [], set()
    for item in items:
        query = _EMPHASIS.sub(r'\2', item.strip()).strip().strip('"\'`“”').strip()
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
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value   # a list of numbers is a citation mark ([1]) in a line, not the answer
    return None
