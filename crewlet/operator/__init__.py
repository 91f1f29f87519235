"""The operator MCP server (DESIGN §16): the company as tools for an
operator's own agent — Claude Desktop, Claude Code, any MCP client.

========  ================================================================
tools     each tool one ``/v1`` route, its input schema the route's own
          (from the API's OpenAPI document), called with the caller's token
          (:mod:`.tools`)
server    the ``mcp`` SDK's server offering them, over stdio (``crewletctl
          mcp``) or streamable HTTP (``/v1/mcp`` in ingress) (:mod:`.server`)
========  ================================================================

Nothing here reads or writes the fleet's state itself: every call is an API
request, so it goes through the estate router, the scopes and the checks every
other surface goes through, and answers what the API answers.
"""
