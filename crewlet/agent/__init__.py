"""A seat at work: the turn loop, model providers, tools and MCP servers.

============  ===============================================================
types         the vocabulary every part shares: messages, tool specs, replies
providers/    model providers (scripted, openai, anthropic, cli): the only
              retry loop, and where 429 cooldowns and token usage come from
tools         the tool registry a provider sees as schemas, and the built-ins
mcp           a seat's stdio MCP servers, started with its lease
janitor       kills what an earlier seats process spawned and left behind
demo_mcp      crewlet-demo-mcp, the sample company's offline MCP server
turn          one turn: admission, the ledger, rounds under the fence, the record
============  ===============================================================
"""
