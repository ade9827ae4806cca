CREATE TABLE IF NOT EXISTS {table} (
  key TEXT COLLATE "C" PRIMARY KEY,
  holder TEXT,
  token TEXT,
  fence BIGINT NOT NULL,
  acquired TIMESTAMPTZ NOT NULL,
  renewed TIMESTAMPTZ NOT NULL,
  expires TIMESTAMPTZ NOT NULL,
  ttl_ms BIGINT NOT NULL,
  waiter TEXT,
  waiter_token TEXT,
  waiter_expires TIMESTAMPTZ,
  waiter_ttl_ms BIGINT,
  pid INTEGER,
  host TEXT,
  labels TEXT NOT NULL DEFAULT '{}',
  watched BOOLEAN NOT NULL DEFAULT false,
  permit_kind TEXT,
  permit_count INTEGER,
  waiter_write BOOLEAN NOT NULL DEFAULT false
);
CREATE SEQUENCE IF NOT EXISTS {sequence};
{create_permits}
