-- Schema version 0: epochs keyed by (job, epoch); no worlds table, no owners.
-- The tables as a coordinator of that schema made them, with rows it could have written.
PRAGMA user_version = 0;
BEGIN TRANSACTION;
CREATE TABLE attempts(
      job INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL, placement TEXT NOT NULL,
      started_at REAL NOT NULL, ended_at REAL, outcome TEXT, PRIMARY KEY(job, attempt));
INSERT INTO "attempts" VALUES(1,1,'w1:0,w1:1',110.0,115.0,'failed: job rank 1 (pid 41 on h1) was killed by signal 9 (SIGKILL): out of memory');
INSERT INTO "attempts" VALUES(1,2,'w1:0,w1:1',120.0,130.0,'succeeded');
INSERT INTO "attempts" VALUES(2,1,'w2:0,w2:1',110.0,NULL,NULL);
INSERT INTO "attempts" VALUES(3,1,'w3:0,w3:1',110.0,115.0,'interrupted: its pool went away');
INSERT INTO "attempts" VALUES(3,2,'w3:0,w3:1',120.0,125.0,'abandoned: not running after a coordinator restart');
INSERT INTO "attempts" VALUES(4,1,'w4:0,w4:1',110.0,112.0,'cancelled');
CREATE TABLE epochs(
      job INTEGER NOT NULL REFERENCES jobs(id), epoch INTEGER NOT NULL, attempt INTEGER NOT NULL,
      csv_line TEXT NOT NULL, csv_header TEXT NOT NULL DEFAULT '', breakdown_json TEXT NOT NULL DEFAULT '',
      PRIMARY KEY(job, epoch));
INSERT INTO "epochs" VALUES(1,1,1,'1,0.9','epoch,train_loss','');
INSERT INTO "epochs" VALUES(1,2,2,'2,0.5','epoch,train_loss','');
CREATE TABLE events(
      job INTEGER NOT NULL REFERENCES jobs(id), at REAL NOT NULL, text TEXT NOT NULL);
INSERT INTO "events" VALUES(1,115.0,'attempt 1 failed: out of memory; requeued');
CREATE TABLE jobs(
      id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, idempotency_key TEXT UNIQUE,
      spec_yaml TEXT NOT NULL, source TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL,
      ranks INTEGER NOT NULL, max_restarts INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
      device TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', submitted_at REAL NOT NULL,
      not_before REAL NOT NULL DEFAULT 0, base_dir TEXT NOT NULL DEFAULT '',
      estimate_s REAL NOT NULL DEFAULT 0);
INSERT INTO "jobs" VALUES(1,'retried','key-1','name: retried
kind: finetune
','retried.yaml','SUCCEEDED',0,2,1,2,'cpu','',100.0,0.0,'/jobs',0.0);
INSERT INTO "jobs" VALUES(2,'running','key-2','name: running
kind: finetune
','running.yaml','RUNNING',0,2,1,1,'cpu','',100.0,0.0,'/jobs',0.0);
INSERT INTO "jobs" VALUES(3,'queued',NULL,'name: queued
kind: finetune
','queued.yaml','QUEUED',0,2,1,0,'cpu','attempt 1 interrupted: its pool went away',100.0,0.0,'/jobs',0.0);
INSERT INTO "jobs" VALUES(4,'cancelled',NULL,'name: cancelled
kind: finetune
','cancelled.yaml','CANCELLED',0,2,1,1,'cpu','cancelled while running by carol',100.0,0.0,'/jobs',0.0);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('jobs',4);
COMMIT;
