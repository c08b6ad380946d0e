-- Quill's two PostgreSQL roles (docs/operations.md, "Database roles";
-- decision 0070). Run it once, as a superuser or a role with CREATEROLE,
-- connected to Quill's database (create that first, as the same role):
--
--   psql -d quill -v owner=quill_owner -v runtime=quill_app -v schema=quill \
--     -f deploy/postgres/roles.sql
--
-- then give both roles a way to log in (\password quill_owner, …), run
-- `api migrate` as the owner and everything else as the runtime role.
-- The tests run this file as it is (internal/dbtest.Roles).

-- The owner owns the schema and every table in it: it runs `api migrate`,
-- and nothing else.
CREATE ROLE :"owner" LOGIN;
-- The runtime role is what `api serve`, the relay, the worker and the
-- operator commands connect as: it reads and writes rows, and may not
-- create, alter, truncate or drop anything.
CREATE ROLE :"runtime" LOGIN;

CREATE SCHEMA :"schema" AUTHORIZATION :"owner";
REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;
GRANT USAGE ON SCHEMA :"schema" TO :"runtime";
-- PostgreSQL 14 lets every role create tables in public (15 no longer).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- The tables and sequences already there, and every one the owner's
-- migrations create from now on.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA :"schema" TO :"runtime";
GRANT USAGE ON ALL SEQUENCES IN SCHEMA :"schema" TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA :"schema"
    GRANT USAGE ON SEQUENCES TO :"runtime";

ALTER ROLE :"owner" SET search_path = :"schema";
ALTER ROLE :"runtime" SET search_path = :"schema";
-- Quill sets this itself, except for a statement outside a transaction
-- behind a transaction pooler (PgBouncer), which has only the role's.
ALTER ROLE :"runtime" SET statement_timeout = '30s';
