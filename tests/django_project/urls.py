"""The test project's URLs."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from django_project import views

router = SimpleRouter(trailing_slash=False)
router.register("api/orders", views.OrderViewSet, basename="order")

urlpatterns = [
    path("health", views.health),
    path("payments", views.payment),
    path("refunds", views.refund),
    path("busy", views.busy),
    path("notes", views.NoteView.as_view()),
    path("api/payments", views.PaymentAPI.as_view()),
    *router.urls,
]
