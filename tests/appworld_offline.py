"""Build AppWorld tasks offline with AppWorld's own code, for the tests (no `appworld download data` here).

Runs under AppWorld's interpreter, not ours:  APPWORLD_ROOT=DIR .venv-appworld/bin/python tests/appworld_offline.py

What AppWorld needs under DIR/data, and how each piece is made here (all with AppWorld's own models and APIs):
- api_docs/standard/<app>.json: `ApiDocCollection.build` from the apps' code (`Task` loads them). Written by hand:
  `ApiDocCollection.save(formats=("standard",))` writes every format and fails on the missing folders.
- base_dbs/<app>.db: every app's empty schema plus the `api_docs.ApiDoc` rows (what `apis.api_docs.*` serve).
- tasks/<id>/dbs: the task's starting databases in AppWorld's "changes" format (SQL replayed on base_dbs), seeded
  with the supervisor (admin MainUser, supervisor profile, its Task row and account passwords) and a Simple Note
  user with two notes, while the clock is frozen at the task's date — `Task.save`'s own call.
- tasks/<id>/specs.json, ground_truth/ (minimal mode: metadata with its required counts, public/private data,
  answer, test_data, and an evaluation.py in AppWorld's style, whose requirement strings match test_data's) and
  compiled_solution.py (the train split's solution: our env's ground truth). `GroundTruth.save` would need ruff.
- datasets/train.txt: the split.

The tasks (one scenario, two tasks): "create the note T with content C, then tell me how many notes I have" —
two notes at the start, so the answer is 3. Evaluation: 4 tests (answer, only simple_note.Note changed, one note
added, its title/content/owner).
"""

import json
import os
import shutil

from appworld.apps import get_all_apps
from appworld.apps.api_lib import set_local_date_and_time, unset_local_date_and_time
from appworld.apps.model_lib import CachedDBHandler, get_db_home_path
from appworld.collections.api_docs import ApiDocCollection
from appworld.collections.models import ModelCollection
from appworld.common.constants import CANARY_STRING, DB_VERSION
from appworld.common.datetime import DateTime
from appworld.common.path_store import path_store
from appworld.common.utils import write_json

TASKS = {"0ff11ne_1": ("Grocery List", "eggs, milk, bread"), "0ff11ne_2": ("Packing", "passport, charger")}
SUPERVISOR = dict(first_name="Joyce", last_name="Weaver", email="joyce-weav@gmail.com", phone_number="3155673041",
                  birthday="1991-03-14", sex="female")
PASSWORD = "Wz6!pQ9#note"
TASK_DATETIME = DateTime(2023, 5, 18, 12, 0, 0)
REQUIREMENTS = ("assert answers match.", "assert model changes match simple_note.Note.",
                "assert 1 simple_note.Note has been added, 0 updated, 0 removed.",
                "assert the added note has the title and content from private_data and belongs to the supervisor.")
SOLUTION = """passwords = apis.supervisor.show_account_passwords()
password = [p for p in passwords if p['account_name'] == 'simple_note'][0]['password']
token = apis.simple_note.login(username=apis.supervisor.show_profile()['email'], password=password)['access_token']
apis.simple_note.create_note(title={title!r}, content={content!r}, access_token=token)
notes = apis.simple_note.search_notes(access_token=token, page_limit=20)
apis.supervisor.complete_task(answer=len(notes))"""
EVALUATION = '''# Canary String: {canary}
import json


def evaluate(test, public_data, private_data, main_user, models, ground_truth_answer):
    task = models.end.supervisor.Task.all()[0]
    try:
        predicted_answer = json.loads(task.answer)
    except json.JSONDecodeError:
        predicted_answer = task.answer
    test.task_completed = task.status == "success"
    with test("""{r0}"""):
        test.answer(predicted_answer, ground_truth_answer)
    with test("""{r1}"""):
        test.case(models.changed_model_names(), "==", {{"simple_note.Note"}})
    with test("""{r2}"""):
        added, updated, removed = models.changed_records("simple_note.Note")
        test.case(len(added), "==", 1)
        test.case(len(updated), "==", 0)
        test.case(len(removed), "==", 0)
    with test("""{r3}"""):
        note = added[0]
        test.case(note.title.strip(), "==", private_data.note_title)
        test.case(note.content.strip(), "==", private_data.note_content)
        owner = models.end.simple_note.User.find_one(email=main_user.email)
        test.case(note.user_id, "==", owner.id)
'''


def build_shared(data: str) -> None:
    """api_docs/ and base_dbs/, shared by every task."""
    docs = ApiDocCollection.build(load_apps=tuple(get_all_apps(skip_admin=True)))
    folder = os.path.join(data, "api_docs", "standard")
    shutil.rmtree(os.path.join(data, "api_docs"), ignore_errors=True)
    os.makedirs(folder)
    rows = []
    for app_name, name_to_doc in docs.items():
        write_json({api: {**doc, "canary_string": CANARY_STRING} for api, doc in name_to_doc.items()},
                   os.path.join(folder, f"{app_name}.json"), silent=True)
        rows += [dict(app_name_=app_name, api_name=api, path=doc["path"], method=doc["method"],
                      description=doc["description"], parameters=doc["parameters"],
                      response_schemas=doc["response_schemas"]) for api, doc in name_to_doc.items()]
    base = ModelCollection.load(to_db_home_path=":memory:offline_base", load_apps=list(get_all_apps()),
                                create_db=True)
    base.api_docs.ApiDoc.save_all([base.api_docs.ApiDoc.create(**row) for row in rows])
    base.save(db_home_path=get_db_home_path(storage_type="disk", type="base"), format="full",
              app_names=list(get_all_apps()), save_model_hashes=True, delete_if_exists=True)
    base.close()


def build_task(data: str, task_id: str, title: str, content: str) -> None:
    directory = os.path.join(data, "tasks", task_id)
    shutil.rmtree(directory, ignore_errors=True)
    freezer = set_local_date_and_time(TASK_DATETIME)  # created_at and friends: the task's date
    models = ModelCollection.load(to_db_home_path=get_db_home_path(storage_type="memory", type="task_input",
                                                                   task_id=task_id),
                                  from_db_home_path=get_db_home_path(storage_type="disk", type="base"),
                                  load_apps=list(get_all_apps()))
    admin, supervisor, notes = models.admin, models.supervisor, models.simple_note
    main_user = admin.MainUser.create_save(**SUPERVISOR)
    admin.AccountPassword.create_save(main_user_id=main_user.id, account_name="simple_note", password=PASSWORD)
    profile = supervisor.Supervisor.create_save(**SUPERVISOR)
    supervisor.AccountPassword.create_save(supervisor_id=profile.id, account_name="simple_note", password=PASSWORD)
    instruction = (f"Create a new note in my Simple Note account titled '{title}' with the content '{content}'. "
                   f"Then tell me how many notes I have in Simple Note in total.")
    supervisor.Task.create_save(supervisor_id=profile.id, instruction=instruction)
    user = notes.User.create_save(first_name=SUPERVISOR["first_name"], last_name=SUPERVISOR["last_name"],
                                  email=SUPERVISOR["email"], password=PASSWORD, verified=True)
    for note_title, note_content in (("Books to read", "Dune; Piranesi"), ("Workout plan", "Mon: run 5k")):
        notes.Note.create_save(user_id=user.id, title=note_title, content=note_content, tags=["personal"])
    models.save(db_home_path=os.path.join(directory, "dbs"), format="changes", app_names=list(get_all_apps()),
                save_model_hashes=True)
    models.close()
    CachedDBHandler.reset()
    unset_local_date_and_time(freezer)

    write_json({"instruction": instruction, "datetime": TASK_DATETIME.isoformat(), "db_version": DB_VERSION,
                "supervisor": {key: SUPERVISOR[key] for key in ("first_name", "last_name", "email", "phone_number")},
                "canary_string": CANARY_STRING}, os.path.join(directory, "specs.json"), silent=True)
    truth = os.path.join(directory, "ground_truth")
    os.makedirs(truth)
    with open(os.path.join(truth, "evaluation.py"), "w") as file:
        file.write(EVALUATION.format(canary=CANARY_STRING, r0=REQUIREMENTS[0], r1=REQUIREMENTS[1],
                                     r2=REQUIREMENTS[2], r3=REQUIREMENTS[3]))
    with open(os.path.join(truth, "compiled_solution.py"), "w") as file:
        file.write(SOLUTION.format(title=title, content=content) + "\n")
    # minimal mode computes these counts from files it does not load, so they must be given
    write_json({"difficulty": 1, "num_apps": 1, "num_apis": 5, "num_api_calls": 6, "num_solution_code_lines": 6},
               os.path.join(truth, "metadata.json"), silent=True)
    write_json({"app": "simple_note"}, os.path.join(truth, "public_data.json"), silent=True)
    write_json({"note_title": title, "note_content": content}, os.path.join(truth, "private_data.json"), silent=True)
    with open(os.path.join(truth, "answer.json"), "w") as file:
        file.write(json.dumps(3))
    write_json([{"requirement": requirement, "label": "no_op_fail"} for requirement in REQUIREMENTS],
               os.path.join(truth, "test_data.json"), silent=True)


def main() -> None:
    data = path_store.data
    build_shared(data)
    for task_id, (title, content) in TASKS.items():
        build_task(data, task_id, title, content)
    os.makedirs(os.path.join(data, "datasets"), exist_ok=True)
    with open(os.path.join(data, "datasets", "train.txt"), "w") as file:
        file.write("\n".join(TASKS) + "\n")
    print(json.dumps({"data": data, "tasks": list(TASKS)}))


if __name__ == "__main__":
    main()
