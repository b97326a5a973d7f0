"""Load-tool clients: for each tool a command builder, a parser of its real output into a
LoadResult, and a run() that executes it pinned to the client CPUs with a deadline."""
