"""The text path from tokens to response parts: incremental detokenization, stop strings,
reasoning separation, tool-call routing and the grammars that force a tool call."""
