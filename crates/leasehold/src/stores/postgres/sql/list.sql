SELECT {record} FROM {table} AS t WHERE starts_with(t.key, $1) ORDER BY t.key COLLATE "C"
