-- Every statement jobs-subject runs, one named block each (``-- name: <block>``).
--
-- The catalog blocks run as written. The others are templates: each {placeholder} is filled
-- through psycopg.sql with quoted identifiers and fragments the plan built from the catalog
-- (table and column names, their types), never with a value; values are psycopg parameters,
-- %(name)s, always sent as text and cast to the column's own type, so a key compares with the
-- column's index. Aliases: t is the table a statement works on, p the parent whose page of keys
-- it reads, m1, m2, ... the tables a membership test walks up to the subject.

-- name: foreign_keys
-- Every foreign key of the database, its columns in key order, what ON DELETE does and which
-- columns that action sets (PostgreSQL 15's column list for SET NULL/SET DEFAULT; earlier
-- servers have no confdelsetcols, and to_jsonb answers nothing for it: all the columns).
-- conparentid = 0 keeps a partitioned table's own key and drops the copies on its partitions.
SELECT c.conname,
       cn.nspname, cl.relname,
       pn.nspname, pl.relname,
       ARRAY(SELECT a.attname
             FROM unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
             ORDER BY k.ord) AS columns,
       ARRAY(SELECT a.attname
             FROM unnest(c.confkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.attnum
             ORDER BY k.ord) AS parent_columns,
       c.confdeltype::text,
       c.confmatchtype::text,
       ARRAY(SELECT a.attname
             FROM jsonb_array_elements_text(
                      coalesce(nullif(to_jsonb(c) -> 'confdelsetcols', 'null'), '[]')) AS s(attnum)
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = s.attnum::int2
             ORDER BY a.attnum) AS set_columns
FROM pg_constraint c
JOIN pg_class cl ON cl.oid = c.conrelid
JOIN pg_namespace cn ON cn.oid = cl.relnamespace
JOIN pg_class pl ON pl.oid = c.confrelid
JOIN pg_namespace pn ON pn.oid = pl.relnamespace
WHERE c.contype = 'f' AND c.conparentid = 0
ORDER BY cn.nspname, cl.relname, c.conname

-- name: tables
-- The tables named by (schema, name) pairs, and every table of the schemas named whole: their
-- columns in order with type, NOT NULL and whether a write may set them (a generated column or
-- an identity GENERATED ALWAYS may not), and each unique key (non-partial, on columns only).
SELECT n.nspname, c.relname,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'name', a.attname,
                     'type', format_type(a.atttypid, a.atttypmod),
                     'not_null', a.attnotnull,
                     'generated', a.attgenerated <> '' OR a.attidentity = 'a') ORDER BY a.attnum)
                 FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                '[]'::jsonb) AS columns,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'primary', i.indisprimary,
                     'columns', ARRAY(SELECT a.attname
                                      FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
                                      JOIN pg_attribute a
                                        ON a.attrelid = c.oid AND a.attnum = k.attnum
                                      WHERE k.ord <= i.indnkeyatts
                                      ORDER BY k.ord))
                     ORDER BY i.indisprimary DESC, i.indexrelid)
                 FROM pg_index i
                 WHERE i.indrelid = c.oid AND i.indisunique AND i.indisvalid
                   AND i.indpred IS NULL AND i.indexprs IS NULL),
                '[]'::jsonb) AS unique_keys
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND ((n.nspname, c.relname) IN (SELECT u.s, u.t
                                  FROM unnest(%(schemas)s::text[], %(names)s::text[]) AS u(s, t))
       OR n.nspname = ANY(%(whole)s::text[]))
ORDER BY n.nspname, c.relname

-- name: now
-- The database's clock: when an erase finished, when an export was indexed.
SELECT now()

-- name: member_key
-- Membership of the subject's own table: its key equals the subject's.
({columns}) = ({values})

-- name: member_edge
-- Membership through one foreign key: the row references a row of the parent that is itself
-- the subject's (EXISTS, so a NULL key is simply not a member).
EXISTS (SELECT 1 FROM {parent} AS {alias} WHERE {join} AND {member})

-- name: parent_page
-- One page of the parent's keys among the subject's rows, after the cursor, in key order;
-- as text, so the cursor and the key list round-trip through JSON exactly.
SELECT {keys}
FROM {parent} AS p
WHERE {not_null} AND {member} {after}
ORDER BY {order}
LIMIT %(batch)s

-- name: after
-- The keyset condition of a page after the first.
AND ({columns}) > ({cursor})

-- name: delete_page
-- The erase's write for one page: the rows whose key is in the page's key list.
DELETE FROM {table} AS t
WHERE ({columns}) IN (SELECT * FROM unnest({arrays}))

-- name: update_page
-- ANONYMIZE's write for one page, and a loop-closing key cleared (SET its columns = NULL).
UPDATE {table} AS t SET {assignments}
WHERE ({columns}) IN (SELECT * FROM unnest({arrays}))

-- name: delete_subject
-- The subject's own row, last.
DELETE FROM {table} AS t WHERE {member}

-- name: update_subject
-- The subject's own row anonymised instead of deleted.
UPDATE {table} AS t SET {assignments} WHERE {member}

-- name: count_members
-- The census: how many of a table's rows are the subject's (before any write).
SELECT count(*) FROM {table} AS t WHERE {member}

-- name: count_linked
-- The census of a loop-closing key: rows of any owner that reference the subject's rows by it.
SELECT count(*) FROM {table} AS t WHERE {linked}

-- name: select_page
-- The export of one page: the table's rows in the page's key list that no earlier key of the
-- table already exported.
SELECT {columns}
FROM {table} AS t
WHERE ({keys}) IN (SELECT * FROM unnest({arrays})) {not_earlier}
ORDER BY {order}

-- name: select_subject
-- The subject's own row: exported, and handed fresh to each target step.
SELECT {columns} FROM {table} AS t WHERE {member}

-- name: checksum
-- subject_proof: an order-free digest of rows rendered as text, and their count.
SELECT md5(coalesce(string_agg(r, chr(10) ORDER BY r), '')), count(*)
FROM ({rows}) AS x(r)

-- name: rendered_rows
-- subject_proof: a table's rows (those the condition keeps) rendered as one text each.
SELECT ROW({expressions})::text FROM {table} AS t WHERE {condition}
