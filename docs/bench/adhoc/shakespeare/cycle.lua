local reqs, n, i = {}, 0, 0
init = function(args)
  for line in io.lines("/tmp/dynprof/paths.txt") do
    if line ~= "" then n = n + 1; reqs[n] = wrk.format(nil, line) end
  end
end
request = function()
  i = i % n + 1
  return reqs[i]
end
