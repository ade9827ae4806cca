SELECT {record} FROM {table} AS t WHERE t.key = $1
