local keys, args = KEYS, ARGV
