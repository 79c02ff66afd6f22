-- Schema version 3: an attempt's outcome is the wire's Outcome by name, its reason in end_reason.
-- The tables as a coordinator of that schema made them (migrated from version 2), with rows it could have written.
PRAGMA user_version = 3;
BEGIN TRANSACTION;
CREATE TABLE attempts(
      job INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL, placement TEXT NOT NULL,
      started_at REAL NOT NULL, ended_at REAL, outcome TEXT, ran_from REAL NOT NULL DEFAULT 0,
      ranks INTEGER NOT NULL DEFAULT 0, gpus INTEGER NOT NULL DEFAULT 0, preempted_by INTEGER NOT NULL DEFAULT 0, end_reason TEXT NOT NULL DEFAULT '', PRIMARY KEY(job, attempt));
INSERT INTO attempts VALUES(1,1,'w1:0,w1:1',110.0,115.0,'failed',111.0,2,0,0,'job rank 1 (pid 41 on h1) was killed by signal 9 (SIGKILL): out of memory');
INSERT INTO attempts VALUES(1,2,'w1:0,w1:1',120.0,130.0,'succeeded',121.0,2,0,0,'');
INSERT INTO attempts VALUES(2,1,'w2:0,w2:1',110.0,NULL,NULL,111.0,2,0,0,'');
INSERT INTO attempts VALUES(3,1,'w3:0,w3:1',110.0,115.0,'interrupted',111.0,2,0,0,'its pool went away');
INSERT INTO attempts VALUES(3,2,'w3:0,w3:1',120.0,125.0,'abandoned',121.0,2,0,0,'not running after a coordinator restart');
INSERT INTO attempts VALUES(4,1,'w4:0,w4:1',110.0,112.0,'cancelled',111.0,2,0,0,'');
INSERT INTO attempts VALUES(6,1,'w6:0,w6:1',110.0,118.0,'stopped',111.0,2,0,0,'stopped by search 5 at epoch 1 (Note [ASHA]: not among the best at that rung)');
CREATE TABLE epochs(
      job INTEGER NOT NULL REFERENCES jobs(id), epoch INTEGER NOT NULL, attempt INTEGER NOT NULL,
      csv_line TEXT NOT NULL, csv_header TEXT NOT NULL DEFAULT '', breakdown_json TEXT NOT NULL DEFAULT '',
      PRIMARY KEY(job, epoch));
INSERT INTO epochs VALUES(1,1,1,'1,0.9','epoch,train_loss','');
INSERT INTO epochs VALUES(1,2,2,'2,0.5','epoch,train_loss','');
CREATE TABLE events(
      job INTEGER NOT NULL REFERENCES jobs(id), at REAL NOT NULL, text TEXT NOT NULL);
INSERT INTO events VALUES(1,115.0,'attempt 1 failed: out of memory; requeued');
CREATE TABLE jobs(
      id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, idempotency_key TEXT UNIQUE,
      spec_yaml TEXT NOT NULL, source TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL,
      ranks INTEGER NOT NULL, max_restarts INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
      device TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', submitted_at REAL NOT NULL,
      not_before REAL NOT NULL DEFAULT 0, base_dir TEXT NOT NULL DEFAULT '',
      estimate_s REAL NOT NULL DEFAULT 0, user TEXT NOT NULL DEFAULT '',
      preemptible INTEGER NOT NULL DEFAULT 1, search INTEGER NOT NULL DEFAULT 0, kind TEXT NOT NULL DEFAULT '', metric TEXT NOT NULL DEFAULT '');
INSERT INTO jobs VALUES(1,'retried','carol/key-1',replace('name: retried\nkind: finetune\n','\n',char(10)),'retried.yaml','SUCCEEDED',0,2,1,2,'cpu','',100.0,0.0,'/jobs',0.0,'carol',1,0,'','');
INSERT INTO jobs VALUES(2,'running','carol/key-2',replace('name: running\nkind: finetune\n','\n',char(10)),'running.yaml','RUNNING',0,2,1,1,'cpu','',100.0,0.0,'/jobs',0.0,'carol',1,0,'','');
INSERT INTO jobs VALUES(3,'queued',NULL,replace('name: queued\nkind: finetune\n','\n',char(10)),'queued.yaml','QUEUED',0,2,1,0,'cpu','attempt 1 interrupted: its pool went away',100.0,0.0,'/jobs',0.0,'dave',1,0,'','');
INSERT INTO jobs VALUES(4,'cancelled',NULL,replace('name: cancelled\nkind: finetune\n','\n',char(10)),'cancelled.yaml','CANCELLED',0,2,1,1,'cpu','cancelled while running by carol',100.0,0.0,'/jobs',0.0,'carol',1,0,'','');
INSERT INTO jobs VALUES(5,'search',NULL,replace('name: search\nkind: finetune\n','\n',char(10)),'search.yaml','RUNNING',0,2,1,0,'cpu','',100.0,0.0,'/jobs',0.0,'carol',1,0,'search','');
INSERT INTO jobs VALUES(6,'search-trial-1',NULL,replace('name: search-trial-1\nkind: finetune\n','\n',char(10)),'search-trial-1.yaml','STOPPED',0,2,1,1,'cpu','stopped by search 5 at epoch 1',100.0,0.0,'/jobs',0.0,'carol',1,5,'','');
CREATE TABLE rung_results(
      search INTEGER NOT NULL REFERENCES jobs(id), epoch INTEGER NOT NULL, trial INTEGER NOT NULL,
      value REAL, promoted INTEGER NOT NULL, at REAL NOT NULL, PRIMARY KEY(search, epoch, trial));
CREATE TABLE searches(
      job INTEGER PRIMARY KEY REFERENCES jobs(id), method TEXT NOT NULL, metric TEXT NOT NULL,
      maximize INTEGER NOT NULL, eta INTEGER NOT NULL, max_epochs INTEGER NOT NULL,
      max_concurrent INTEGER NOT NULL, rungs TEXT NOT NULL);
CREATE TABLE trials(
      search INTEGER NOT NULL REFERENCES jobs(id), trial INTEGER NOT NULL, name TEXT NOT NULL,
      params_json TEXT NOT NULL, yaml TEXT NOT NULL, base_dir TEXT NOT NULL, source TEXT NOT NULL,
      priority INTEGER NOT NULL, ranks INTEGER NOT NULL, max_restarts INTEGER NOT NULL, device TEXT NOT NULL,
      estimate_s REAL NOT NULL, preemptible INTEGER NOT NULL, job INTEGER NOT NULL DEFAULT 0,
      stopped_at INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(search, trial));
CREATE TABLE worlds(
      world TEXT PRIMARY KEY, token TEXT NOT NULL, registered_at REAL NOT NULL);
INSERT INTO worlds VALUES('w1','token-1',100.0);
DELETE FROM sqlite_sequence;
INSERT INTO sqlite_sequence VALUES('jobs',6);
CREATE INDEX jobs_by_state ON jobs(state, id);
CREATE INDEX jobs_by_user ON jobs(user, id);
CREATE INDEX attempts_open ON attempts(job, attempt) WHERE ended_at IS NULL;
CREATE INDEX events_by_job ON events(job);
CREATE INDEX trials_by_job ON trials(job) WHERE job != 0;
COMMIT;
